/*
 * yaml_to_json [--validate] FILE: prints the documents the model library
 * reads from FILE (sl_yaml_to_json) as one JSON array, or its errors on
 * stderr and exit 1. With --validate, each document must also pass the
 * model's validation (sl_model_validate: fields of one document, no
 * references). Used by tests/integration/test_docs_yaml.py to compare, value
 * by value, what sluice and kubectl read from the same text, and by
 * test_crds.py to compare the model's verdicts with the CRDs' schemas.
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    int validate = argc == 3 && strcmp(argv[1], "--validate") == 0;
    if (argc != 2 + validate) {
        fprintf(stderr, "usage: yaml_to_json [--validate] FILE\n");
        return 2;
    }
    const char *path = argv[1 + validate];
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 2;
    }
    char *text = NULL;
    size_t len = 0, cap = 0, n;
    char chunk[65536];
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *t = realloc(text, cap);
            if (!t) {
                fputs("out of memory\n", stderr);
                return 2;
            }
            text = t;
        }
        memcpy(text + len, chunk, n);
        len += n;
    }
    fclose(f);
    sl_errors_t errs;
    sl_errors_init(&errs);
    json_t *docs = sl_yaml_to_json(text ? text : "", len, path, &errs);
    free(text);
    if (!docs) {
        char *s = sl_errors_format(&errs);
        fputs(s, stderr);
        free(s);
        sl_errors_free(&errs);
        return 1;
    }
    size_t i;
    json_t *doc;
    int bad = 0;
    json_array_foreach(docs, i, doc)
    {
        if (validate && !json_is_null(doc) && sl_model_validate(doc, path, (int)i + 1, &errs) != 0)
            bad = 1;
    }
    if (bad) {
        char *s = sl_errors_format(&errs);
        fputs(s, stderr);
        free(s);
        sl_errors_free(&errs);
        json_decref(docs);
        return 1;
    }
    json_dumpf(docs, stdout, JSON_COMPACT | JSON_SORT_KEYS);
    fputc('\n', stdout);
    json_decref(docs);
    sl_errors_free(&errs);
    return 0;
}
