/*
 * protobuf-c message -> jansson, walking the message descriptors, so every
 * message of proto/ (and any later one) dumps without per-type code.
 *
 * Responsible for the mapping, which readers of /config_dump rely on:
 *   - keys are the .proto field names (snake_case), in field-number order;
 *   - fields without presence (proto3 scalars, strings, enums, bytes) are
 *     always written, zero values included: a reader never has to know the
 *     defaults to interpret a dump;
 *   - message fields that are absent are omitted (absence means something:
 *     "no health check"); proto2/proto3 `optional` scalars and oneof members
 *     are written only when set;
 *   - repeated fields are always written, [] when empty;
 *   - enums by value name ("TEMPLATE"); a number no name matches stays a
 *     number;
 *   - 64-bit integers as JSON integers; a uint64 above 2^63-1 (which jansson
 *     cannot hold) as a decimal string;
 *   - float/double as numbers; NaN and infinities as "NaN", "Infinity",
 *     "-Infinity" (proto3 JSON mapping), since JSON has no such numbers;
 *   - bytes as standard base64 with padding;
 *   - strings that are not valid UTF-8 (protobuf-c does not check) have each
 *     invalid byte replaced by U+FFFD, so the output is always valid JSON.
 * Not responsible for: JSON -> protobuf, well-known types (Any, Timestamp),
 * unknown fields (skipped).
 *
 * Nesting deeper than SL_PBJSON_MAX_DEPTH fails the whole conversion (NULL)
 * rather than recursing without bound on a hostile recursive message.
 */
#include "pbjson.h"
#include "utf8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SL_PBJSON_MAX_DEPTH 64

static json_t *message_to_json(const ProtobufCMessage *msg, unsigned depth);

static json_t *u64_to_json(uint64_t v)
{
    if (v <= (uint64_t)INT64_MAX)
        return json_integer((json_int_t)v);
    char buf[24];
    size_t n = 0;
    char tmp[24];
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    return json_stringn(buf, n);
}

static json_t *double_to_json(double v)
{
    if (isnan(v))
        return json_string("NaN");
    if (isinf(v))
        return json_string(v > 0 ? "Infinity" : "-Infinity");
    return json_real(v);
}

static json_t *string_to_json(const char *s)
{
    if (!s)
        return json_string("");
    size_t len = strlen(s);
    json_t *j = json_stringn(s, len);
    if (j)
        return j;
    /* Invalid UTF-8: each bad byte becomes U+FFFD (3 bytes). */
    if (len > (SIZE_MAX - 1) / 3)
        return NULL;
    char *fixed = malloc(len * 3 + 1);
    if (!fixed)
        return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = sl_utf8_valid_len(p + i, len - i);
        if (n) {
            memcpy(fixed + o, p + i, n);
            o += n;
            i += n;
        } else {
            memcpy(fixed + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(fixed, o);
    free(fixed);
    return j;
}

static json_t *bytes_to_json(const ProtobufCBinaryData *b)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = b->data ? b->len : 0;
    if (len > SIZE_MAX / 4 * 3 - 3)
        return NULL;
    size_t out_len = (len + 2) / 3 * 4;
    char *out = malloc(out_len + 1);
    if (!out)
        return NULL;
    size_t o = 0, i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)b->data[i] << 16 | (uint32_t)b->data[i + 1] << 8 | b->data[i + 2];
        out[o++] = alphabet[v >> 18];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = alphabet[(v >> 6) & 63];
        out[o++] = alphabet[v & 63];
    }
    if (len - i == 1) {
        uint32_t v = (uint32_t)b->data[i] << 16;
        out[o++] = alphabet[v >> 18];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = '=';
        out[o++] = '=';
    } else if (len - i == 2) {
        uint32_t v = (uint32_t)b->data[i] << 16 | (uint32_t)b->data[i + 1] << 8;
        out[o++] = alphabet[v >> 18];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = alphabet[(v >> 6) & 63];
        out[o++] = '=';
    }
    json_t *j = json_stringn(out, o);
    free(out);
    return j;
}

static json_t *enum_to_json(const ProtobufCEnumDescriptor *d, int value)
{
    const ProtobufCEnumValue *v = d ? protobuf_c_enum_descriptor_get_value(d, value) : NULL;
    if (v && v->name)
        return json_string(v->name);
    return json_integer(value);
}

/* One value of `field` stored at `p` (a struct member or an array element). */
static json_t *value_to_json(const ProtobufCFieldDescriptor *field, const void *p, unsigned depth)
{
    switch (field->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        return json_integer(*(const int64_t *)p);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return u64_to_json(*(const uint64_t *)p);
    case PROTOBUF_C_TYPE_FLOAT:
        return double_to_json(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE:
        return double_to_json(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL:
        return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM:
        return enum_to_json(field->descriptor, *(const int *)p);
    case PROTOBUF_C_TYPE_STRING:
        return string_to_json(*(char *const *)p);
    case PROTOBUF_C_TYPE_BYTES:
        return bytes_to_json((const ProtobufCBinaryData *)p);
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)p;
        return sub ? message_to_json(sub, depth + 1) : json_null();
    }
    }
    return NULL;
}

/* Size of one element of a repeated field's array. */
static size_t element_size(ProtobufCType type)
{
    switch (type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    }
    return 0;
}

/* Whether a non-repeated field is written (see the mapping at the top). */
static int field_present(const ProtobufCMessage *msg, const ProtobufCFieldDescriptor *field)
{
    const char *base = (const char *)msg;
    const void *member = base + field->offset;
    if (field->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        return *(const uint32_t *)(base + field->quantifier_offset) == field->id;
    if (field->type == PROTOBUF_C_TYPE_MESSAGE)
        return *(const void *const *)member != NULL;
    if (field->label == PROTOBUF_C_LABEL_OPTIONAL) {
        if (field->type == PROTOBUF_C_TYPE_STRING)
            return *(const char *const *)member != NULL;
        return *(const protobuf_c_boolean *)(base + field->quantifier_offset);
    }
    return 1; /* required, or proto3 without presence */
}

static json_t *message_to_json(const ProtobufCMessage *msg, unsigned depth)
{
    if (!msg || !msg->descriptor ||
        msg->descriptor->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC ||
        depth > SL_PBJSON_MAX_DEPTH)
        return NULL;
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    json_t *obj = json_object();
    if (!obj)
        return NULL;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *field = &d->fields[i];
        const char *base = (const char *)msg;
        json_t *v;
        if (field->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + field->quantifier_offset);
            const char *arr = *(const char *const *)(base + field->offset);
            size_t esz = element_size(field->type);
            v = json_array();
            if (!v)
                goto fail;
            for (size_t k = 0; arr && k < n; k++) {
                json_t *e = value_to_json(field, arr + k * esz, depth);
                if (!e || json_array_append_new(v, e) != 0) {
                    json_decref(v);
                    goto fail;
                }
            }
        } else {
            if (!field_present(msg, field))
                continue;
            v = value_to_json(field, base + field->offset, depth);
        }
        if (!v || json_object_set_new(obj, field->name, v) != 0)
            goto fail;
    }
    return obj;

fail:
    json_decref(obj);
    return NULL;
}

/* Returns a new reference, or NULL when msg is not a protobuf-c message, is
 * nested too deeply, or memory ran out. The message is only read. */
json_t *sl_pbjson_from_message(const ProtobufCMessage *msg)
{
    return message_to_json(msg, 0);
}
