/*
 * The resource set and how documents get into it: kind names, splitting a
 * file into documents (YAML streams, JSON arrays, Kubernetes "List"
 * objects), loading files and directories, and refusing duplicates across the
 * whole set. Every document goes through sl_model_validate before it is
 * added, so a resource set only ever holds valid resources.
 *
 * Not responsible for YAML syntax (yaml.c), field rules (validate.c) nor
 * defaults and references (compiler.c).
 */
#include "model.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A configuration file larger than this is a mistake (a log, a binary), not
 * an API definition; refuse it before reading it into memory. */
#define SL_MODEL_MAX_FILE_BYTES (64u * 1024u * 1024u)
/* Files per directory: bounded so a wrong path cannot make us read a tree. */
#define SL_MODEL_MAX_DIR_FILES 10000
/* JSON nesting bound, the same as YAML's (yaml.c). */
#define SL_MODEL_MAX_DEPTH 64

static const struct {
    const char *name, *plural;
} kinds[SL_KIND__COUNT] = {
    [SL_KIND_GATEWAY] = {"Gateway", "gateways"},
    [SL_KIND_API] = {"Api", "apis"},
    [SL_KIND_BACKEND] = {"Backend", "backends"},
    [SL_KIND_CONSUMER] = {"Consumer", "consumers"},
    [SL_KIND_CERTIFICATE] = {"Certificate", "certificates"},
};

const char *sl_kind_name(enum sl_kind k)
{
    return (unsigned)k < SL_KIND__COUNT ? kinds[k].name : "?";
}

const char *sl_kind_plural(enum sl_kind k)
{
    return (unsigned)k < SL_KIND__COUNT ? kinds[k].plural : "?";
}

int sl_kind_from_name(const char *name, enum sl_kind *out)
{
    for (int i = 0; name && i < SL_KIND__COUNT; i++) {
        if (strcmp(kinds[i].name, name) == 0) {
            *out = (enum sl_kind)i;
            return 0;
        }
    }
    return -1;
}

int sl_kind_from_plural(const char *plural, enum sl_kind *out)
{
    for (int i = 0; plural && i < SL_KIND__COUNT; i++) {
        if (strcmp(kinds[i].plural, plural) == 0) {
            *out = (enum sl_kind)i;
            return 0;
        }
    }
    return -1;
}

void sl_resource_set_init(sl_resource_set_t *set)
{
    set->items = NULL;
    set->count = 0;
    set->cap = 0;
    set->index = NULL;
}

void sl_resource_set_free(sl_resource_set_t *set)
{
    for (size_t i = 0; i < set->count; i++) {
        json_decref(set->items[i].obj);
        free(set->items[i].source);
    }
    free(set->items);
    json_decref(set->index);
    sl_resource_set_init(set);
}

/* Durations: a non-negative integer of milliseconds, or a string of one
 * number and one unit (ms, s, m, h). One unit only: "1m30s" is refused rather
 * than half-supported. Bounded to 2^32-1 ms (about 49 days) because the
 * snapshot carries uint32 milliseconds. */
int sl_parse_duration_ms(json_t *v, uint64_t *out_ms)
{
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < 0 || (uint64_t)i > UINT32_MAX)
            return -1;
        *out_ms = (uint64_t)i;
        return 0;
    }
    if (!json_is_string(v))
        return -1;
    const char *s = json_string_value(v);
    size_t i = 0;
    uint64_t n = 0;
    if (s[0] < '0' || s[0] > '9')
        return -1;
    while (s[i] >= '0' && s[i] <= '9') {
        n = n * 10 + (uint64_t)(s[i] - '0');
        if (n > UINT32_MAX)
            return -1;
        i++;
    }
    const char *unit = s + i;
    uint64_t mult;
    if (strcmp(unit, "ms") == 0)
        mult = 1;
    else if (strcmp(unit, "s") == 0)
        mult = 1000;
    else if (strcmp(unit, "m") == 0)
        mult = 60 * 1000;
    else if (strcmp(unit, "h") == 0)
        mult = 60 * 60 * 1000;
    else
        return -1;
    if (n > UINT32_MAX / mult)
        return -1;
    *out_ms = n * mult;
    return 0;
}

static int depth_ok(json_t *v, int depth)
{
    if (depth > SL_MODEL_MAX_DEPTH)
        return 0;
    if (json_is_object(v)) {
        const char *k;
        json_t *child;
        json_object_foreach(v, k, child)
        {
            if (!depth_ok(child, depth + 1))
                return 0;
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *child;
        json_array_foreach(v, i, child)
        {
            if (!depth_ok(child, depth + 1))
                return 0;
        }
    }
    return 1;
}

static int set_append(sl_resource_set_t *set, json_t *doc, const char *source, int doc_index)
{
    if (set->count == set->cap) {
        size_t ncap = set->cap ? set->cap * 2 : 16;
        sl_resource_t *n = realloc(set->items, ncap * sizeof(*n));
        if (!n)
            return -1;
        set->items = n;
        set->cap = ncap;
    }
    char *src = strdup(source);
    if (!src)
        return -1;
    sl_resource_t *r = &set->items[set->count];
    json_t *meta = json_object_get(doc, "metadata");
    json_t *ns = json_object_get(meta, "namespace");
    r->obj = json_incref(doc);
    sl_kind_from_name(json_string_value(json_object_get(doc, "kind")), &r->kind);
    r->name = json_string_value(json_object_get(meta, "name"));
    r->ns = json_is_string(ns) ? json_string_value(ns) : "default";
    r->source = src;
    r->doc = doc_index;
    r->hash = 0;
    if (!set->index && !(set->index = json_object()))
        return -1;
    char key[1024];
    snprintf(key, sizeof(key), "%s/%s/%s", sl_kind_name(r->kind), r->ns, r->name ? r->name : "");
    json_object_set_new(set->index, key, json_integer((json_int_t)set->count));
    set->count++;
    return 0;
}

uint64_t sl_json_hash(json_t *doc)
{
    char *text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)(text ? text : ""); *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
    }
    free(text);
    return h ? h : 1;
}

uint64_t sl_resource_hash(const sl_resource_t *r)
{
    return r->hash ? r->hash : sl_json_hash(r->obj);
}

int sl_resource_set_add(sl_resource_set_t *set, json_t *doc, const char *source, int doc_index)
{
    return set_append(set, doc, source, doc_index);
}

static void place(char *buf, size_t len, const char *source, int doc)
{
    if (source[0])
        snprintf(buf, len, "%s doc %d", source, doc);
    else
        snprintf(buf, len, "doc %d", doc);
}

/* Validates one document and appends it unless it duplicates a resource
 * already in the set. */
static int add_document(sl_resource_set_t *set, json_t *doc, const char *source, int doc_index,
                        sl_errors_t *errs)
{
    if (!depth_ok(doc, 0)) {
        sl_errors_add(errs, source, doc_index, "", "nesting deeper than %d levels",
                      SL_MODEL_MAX_DEPTH);
        return -1;
    }
    if (sl_model_validate(doc, source, doc_index, errs) != 0)
        return -1;
    json_t *meta = json_object_get(doc, "metadata");
    const char *kind = json_string_value(json_object_get(doc, "kind"));
    const char *name = json_string_value(json_object_get(meta, "name"));
    json_t *nsv = json_object_get(meta, "namespace");
    const char *ns = json_is_string(nsv) ? json_string_value(nsv) : "default";
    char key[1024];
    snprintf(key, sizeof(key), "%s/%s/%s", kind, ns, name);
    json_t *pos = set->index ? json_object_get(set->index, key) : NULL;
    if (pos) {
        const sl_resource_t *r = &set->items[json_integer_value(pos)];
        char where[512];
        place(where, sizeof(where), r->source, r->doc);
        sl_errors_add(errs, source, doc_index, "metadata.name",
                      "%s \"%s/%s\" is defined twice (also at %s)", kind, ns, name, where);
        return -1;
    }
    if (set_append(set, doc, source, doc_index) != 0) {
        sl_errors_add(errs, source, doc_index, "", "out of memory");
        return -1;
    }
    return 0;
}

/* A document that is a Kubernetes List contributes its items, each counted
 * as a document of its own for error positions. */
static bool is_list(json_t *doc)
{
    return json_is_object(doc) && json_is_array(json_object_get(doc, "items")) &&
           json_is_string(json_object_get(doc, "kind")) &&
           strcmp(json_string_value(json_object_get(doc, "kind")), "List") == 0;
}

int sl_model_parse(sl_resource_set_t *set, const char *text, size_t len, const char *source,
                   sl_errors_t *errs)
{
    if (!source)
        source = "";
    size_t skip = 0;
    /* A UTF-8 byte order mark, then whitespace, before the JSON sniff. */
    if (len >= 3 && (unsigned char)text[0] == 0xEF && (unsigned char)text[1] == 0xBB &&
        (unsigned char)text[2] == 0xBF)
        skip = 3;
    while (skip < len &&
           (text[skip] == ' ' || text[skip] == '\t' || text[skip] == '\r' || text[skip] == '\n'))
        skip++;

    json_t *docs;
    if (skip < len && (text[skip] == '{' || text[skip] == '[')) {
        /* JSON: jansson for exact integer handling and JSON's own errors. */
        json_error_t jerr;
        json_t *v = json_loadb(text + skip, len - skip, JSON_REJECT_DUPLICATES, &jerr);
        if (!v) {
            sl_errors_add(errs, source, 0, "", "line %d column %d: %s", jerr.line, jerr.column,
                          jerr.text);
            return -1;
        }
        if (json_is_array(v)) {
            docs = v;
        } else {
            docs = json_array();
            if (!docs || json_array_append_new(docs, v) != 0) {
                json_decref(v);
                json_decref(docs);
                sl_errors_add(errs, source, 0, "", "out of memory");
                return -1;
            }
        }
    } else {
        docs = sl_yaml_to_json(text, len, source, errs);
        if (!docs)
            return -1;
    }

    int rc = 0, doc_index = 0;
    size_t i;
    json_t *doc;
    json_array_foreach(docs, i, doc)
    {
        if (is_list(doc)) {
            size_t j;
            json_t *item;
            json_array_foreach(json_object_get(doc, "items"), j, item)
            {
                doc_index++;
                if (add_document(set, item, source, doc_index, errs) != 0)
                    rc = -1;
            }
            continue;
        }
        doc_index++;
        if (json_is_null(doc))
            continue; /* empty document */
        if (add_document(set, doc, source, doc_index, errs) != 0)
            rc = -1;
    }
    json_decref(docs);
    return rc;
}

static int load_file(sl_resource_set_t *set, const char *path, sl_errors_t *errs)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        sl_errors_add(errs, path, 0, "", "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        sl_errors_add(errs, path, 0, "", "cannot stat: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        sl_errors_add(errs, path, 0, "", "not a regular file");
        close(fd);
        return -1;
    }
    if ((uint64_t)st.st_size > SL_MODEL_MAX_FILE_BYTES) {
        sl_errors_add(errs, path, 0, "", "file is larger than %u bytes", SL_MODEL_MAX_FILE_BYTES);
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size + 1);
    if (!buf) {
        sl_errors_add(errs, path, 0, "", "out of memory");
        close(fd);
        return -1;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            sl_errors_add(errs, path, 0, "", "read failed: %s", strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        if (n == 0)
            break; /* truncated while reading: parse what is there */
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    int rc = sl_model_parse(set, buf, got, path, errs);
    free(buf);
    return rc;
}

static bool has_config_ext(const char *name)
{
    size_t n = strlen(name);
    static const char *const exts[] = {".yaml", ".yml", ".json"};
    for (size_t i = 0; i < sizeof(exts) / sizeof(exts[0]); i++) {
        size_t e = strlen(exts[i]);
        if (n > e && strcmp(name + n - e, exts[i]) == 0)
            return true;
    }
    return false;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int sl_model_load_path(sl_resource_set_t *set, const char *path, sl_errors_t *errs)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        sl_errors_add(errs, path, 0, "", "cannot open: %s", strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return load_file(set, path, errs);

    DIR *d = opendir(path);
    if (!d) {
        sl_errors_add(errs, path, 0, "", "cannot open directory: %s", strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        /* Hidden files are editor and Kubernetes ConfigMap artefacts
         * ("..data" links, ".#file"), never configuration. */
        if (de->d_name[0] == '.' || !has_config_ext(de->d_name))
            continue;
        if (n == SL_MODEL_MAX_DIR_FILES) {
            sl_errors_add(errs, path, 0, "", "more than %d configuration files",
                          SL_MODEL_MAX_DIR_FILES);
            rc = -1;
            break;
        }
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            char **nn = realloc(names, ncap * sizeof(*nn));
            if (!nn) {
                sl_errors_add(errs, path, 0, "", "out of memory");
                rc = -1;
                break;
            }
            names = nn;
            cap = ncap;
        }
        names[n] = strdup(de->d_name);
        if (!names[n]) {
            sl_errors_add(errs, path, 0, "", "out of memory");
            rc = -1;
            break;
        }
        n++;
    }
    closedir(d);
    if (rc == 0) {
        qsort(names, n, sizeof(*names), cmp_names);
        size_t plen = strlen(path);
        bool slash = plen > 0 && path[plen - 1] == '/';
        for (size_t i = 0; i < n; i++) {
            char *full = NULL;
            if (asprintf(&full, "%s%s%s", path, slash ? "" : "/", names[i]) < 0) {
                sl_errors_add(errs, path, 0, "", "out of memory");
                rc = -1;
                break;
            }
            if (load_file(set, full, errs) != 0)
                rc = -1;
            free(full);
        }
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}
