/*
 * libFuzzer driver: the json-schema policy (policies/json-schema/,
 * json_schema.c included to reach its hooks): the schema compiler on
 * operator input and the body check on client input. A body is untrusted:
 * whatever it holds, the answer is "continue" or a 400 with a message,
 * never a crash, a hang or an unbounded recursion.
 *
 * Input: byte 0 picks the schema: a built-in one (pets with $defs and
 * patterns, a recursive tree, combinators, `true`, `false`) or, for values
 * from 5 up, the JSON text before the first "\n@@\n" of the rest; what
 * follows is the request body (or all of the rest, for a built-in schema).
 *
 * Invariants (abort() on violation):
 *  - compile returns NULL exactly when it reported errors, and they format;
 *  - on_body gives CONTINUE, or REPLY with 400 invalid_json or
 *    schema_violation and a non-empty message; twice the same answer;
 *  - a body jansson parses is valid for on_body exactly when
 *    sl_jschema_validate says so, and a failure names a keyword and a
 *    pointer that starts with '/' (or is empty, or starts with "...");
 *  - `true` accepts every body that parses, `false` refuses it.
 */
#include "fuzz_util.h"

#include "../../policies/json-schema/json_schema.c"

static const char *const builtin[] = {
    "{\"$defs\": {\"pet\": {\"type\": \"object\", \"required\": [\"name\"], "
    "\"additionalProperties\": false, \"properties\": {\"name\": {\"type\": \"string\", "
    "\"minLength\": 1, \"maxLength\": 20}, \"tag\": {\"type\": [\"string\", \"null\"], "
    "\"pattern\": \"^[a-z]+$\"}, \"age\": {\"type\": \"integer\", \"minimum\": 0, "
    "\"multipleOf\": 0.5}}}}, \"type\": \"object\", \"required\": [\"pets\"], "
    "\"properties\": {\"pets\": {\"type\": \"array\", \"uniqueItems\": true, \"items\": "
    "{\"$ref\": \"#/$defs/pet\"}}}}",
    "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"enum\": [1, "
    "\"a\", null, [1]]}, \"kids\": {\"type\": \"array\", \"items\": {\"$ref\": "
    "\"#/$defs/node\"}, \"contains\": {\"required\": [\"v\"]}, \"maxContains\": 3}}, "
    "\"patternProperties\": {\"^x-\": {\"const\": true}}, \"propertyNames\": "
    "{\"maxLength\": 8}}}, \"$ref\": \"#/$defs/node\"}",
    "{\"anyOf\": [{\"type\": \"string\"}, {\"oneOf\": [{\"type\": \"integer\"}, "
    "{\"minimum\": 2}]}, {\"not\": {\"type\": \"object\"}}, {\"if\": {\"required\": "
    "[\"a\"]}, \"then\": {\"dependentRequired\": {\"a\": [\"b\"]}}, \"else\": "
    "{\"prefixItems\": [true, false]}}]}",
    "true",
    "false",
};
#define NBUILTIN (sizeof(builtin) / sizeof(builtin[0]))

static json_schema_t *make(json_t *schema)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    sl_vctx_t c = {.errs = &errs};
    sl_jschema_t *s = sl_jschema_compile(&c, schema);
    FUZZ_CHECK((s == NULL) == (c.nerr != 0), "compile: %p with %zu errors", (void *)s, c.nerr);
    if (!s) {
        char *text = sl_errors_format(&errs);
        FUZZ_CHECK(text && *text, "errors without text");
        free(text);
        sl_errors_free(&errs);
        return NULL;
    }
    sl_errors_free(&errs);
    json_schema_t *js = calloc(1, sizeof(*js));
    if (!js) {
        sl_jschema_free(s);
        return NULL;
    }
    js->schema = s;
    js->max_depth = 64;
    return js;
}

static int check_body(const json_schema_t *js, const char *body, size_t len,
                      sl_policy_reply_t *reply)
{
    sl_policy_req_t req;
    memset(&req, 0, sizeof(req));
    memset(reply, 0, sizeof(*reply));
    int rc = on_body(js, &req, body, len, reply);
    FUZZ_CHECK(rc == SL_POLICY_CONTINUE || rc == SL_POLICY_REPLY, "rc %d", rc);
    if (rc == SL_POLICY_REPLY) {
        FUZZ_CHECK(reply->status == 400, "status %d", reply->status);
        FUZZ_CHECK(strcmp(reply->code, "invalid_json") == 0 ||
                       strcmp(reply->code, "schema_violation") == 0,
                   "code %s", reply->code);
        FUZZ_CHECK(reply->message[0] && memchr(reply->message, 0, sizeof(reply->message)),
                   "message");
    }
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned pick = data[0];
    const char *rest = (const char *)data + 1;
    size_t rest_len = size - 1;
    json_t *schema;
    const char *body = rest;
    size_t body_len = rest_len;
    if (pick < NBUILTIN) {
        schema = json_loads(builtin[pick], JSON_DECODE_ANY, NULL);
    } else {
        const char *sep = memmem(rest, rest_len, "\n@@\n", 4);
        size_t slen = sep ? (size_t)(sep - rest) : rest_len;
        schema = json_loadb(rest, slen, JSON_DECODE_ANY, NULL);
        body = sep ? sep + 4 : rest + rest_len;
        body_len = sep ? rest_len - slen - 4 : 0;
    }
    if (!schema)
        return 0;
    json_schema_t *js = make(schema);
    json_decref(schema);
    if (!js)
        return 0;
    /* An exact-size copy: a read past the body is a sanitizer report. */
    char *copy = malloc(body_len ? body_len : 1);
    if (!copy) {
        js_free(js);
        return 0;
    }
    memcpy(copy, body, body_len);
    sl_policy_reply_t r1, r2;
    int rc = check_body(js, copy, body_len, &r1);
    int again = check_body(js, copy, body_len, &r2);
    FUZZ_CHECK(rc == again && strcmp(r1.message, r2.message) == 0, "not deterministic");
    json_t *v = body_len
                    ? json_loadb(copy, body_len,
                                 JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL)
                    : NULL;
    if (v && !too_deep(copy, body_len, js->max_depth)) {
        sl_jschema_error_t e;
        int ok = sl_jschema_validate(js->schema, v, &e);
        FUZZ_CHECK(ok == (rc == SL_POLICY_CONTINUE), "validate %d, on_body %d", ok, rc);
        if (!ok) {
            FUZZ_CHECK(e.keyword && *e.keyword, "no keyword");
            FUZZ_CHECK(!e.pointer[0] || e.pointer[0] == '/' || strncmp(e.pointer, "...", 3) == 0,
                       "pointer %s", e.pointer);
        }
        if (pick == 3)
            FUZZ_CHECK(ok, "true refused a value");
        if (pick == 4)
            FUZZ_CHECK(!ok, "false accepted a value");
    }
    json_decref(v);
    free(copy);
    js_free(js);
    return 0;
}
