/*
 * yaml_to_json FILE: prints the documents the model library reads from FILE
 * (sl_yaml_to_json) as one JSON array, or its errors on stderr and exit 1.
 * Used by tests/integration/test_docs_yaml.py to compare, value by value,
 * what sluice and kubectl read from the same text.
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: yaml_to_json FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
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
    json_t *docs = sl_yaml_to_json(text ? text : "", len, argv[1], &errs);
    free(text);
    if (!docs) {
        char *s = sl_errors_format(&errs);
        fputs(s, stderr);
        free(s);
        sl_errors_free(&errs);
        return 1;
    }
    json_dumpf(docs, stdout, JSON_COMPACT | JSON_SORT_KEYS);
    fputc('\n', stdout);
    json_decref(docs);
    sl_errors_free(&errs);
    return 0;
}
