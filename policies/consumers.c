/* Consumers indexed for authentication (consumers.h). */
#include "consumers.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *sha; /* 32 bytes, NULL = empty slot */
    const char *credential;
    const sl_consumer_t *consumer;
} key_slot_t;

typedef struct {
    sl_str_t a, b; /* user (b empty), or (issuer, subject) */
    const char *value;
    const sl_consumer_t *consumer;
    uint8_t used;
} str_slot_t;

struct sl_consumers {
    sl_consumer_t *list;
    size_t n;
    key_slot_t *keys;
    size_t keys_cap; /* power of two, at most half full */
    str_slot_t *users, *subjects;
    size_t users_cap, subjects_cap;
};

static size_t cap_for(size_t n)
{
    size_t cap = 8;
    while (cap < 2 * n)
        cap *= 2;
    return cap;
}

static uint64_t fnv(sl_str_t a, sl_str_t b)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < a.len; i++)
        h = (h ^ (unsigned char)a.ptr[i]) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL; /* separates ("ab","c") from ("a","bc") */
    for (size_t i = 0; i < b.len; i++)
        h = (h ^ (unsigned char)b.ptr[i]) * 1099511628211ULL;
    return h;
}

static int str_eq(sl_str_t x, sl_str_t y)
{
    return x.len == y.len && memcmp(x.ptr, y.ptr, x.len) == 0;
}

static sl_str_t cstr(const char *s)
{
    return (sl_str_t){s, s ? strlen(s) : 0};
}

/* First writer wins: two Consumers claiming one credential is refused by
 * validation at the controller; a standalone file with both keeps the
 * first, in the snapshot's order. */
static void str_put(str_slot_t *t, size_t cap, sl_str_t a, sl_str_t b, const char *value,
                    const sl_consumer_t *c)
{
    for (size_t i = fnv(a, b) & (cap - 1);; i = (i + 1) & (cap - 1)) {
        if (!t[i].used) {
            t[i] = (str_slot_t){a, b, value, c, 1};
            return;
        }
        if (str_eq(t[i].a, a) && str_eq(t[i].b, b))
            return;
    }
}

static const str_slot_t *str_get(const str_slot_t *t, size_t cap, sl_str_t a, sl_str_t b)
{
    if (!t)
        return NULL;
    for (size_t i = fnv(a, b) & (cap - 1);; i = (i + 1) & (cap - 1)) {
        if (!t[i].used)
            return NULL;
        if (str_eq(t[i].a, a) && str_eq(t[i].b, b))
            return &t[i];
    }
}

static uint64_t sha_hash(const uint8_t *sha)
{
    uint64_t h;
    memcpy(&h, sha, sizeof(h)); /* a SHA-256 is uniform already */
    return h;
}

sl_consumers_t *sl_consumers_build(Sluice__V1__Consumer *const *cs, size_t n)
{
    sl_consumers_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    size_t nkeys = 0, nusers = 0, nsubjects = 0;
    for (size_t i = 0; i < n; i++) {
        nkeys += cs[i]->n_api_keys;
        nusers += cs[i]->n_basic_users;
        nsubjects += cs[i]->n_jwt;
    }
    c->list = calloc(n ? n : 1, sizeof(*c->list));
    c->keys_cap = cap_for(nkeys);
    c->users_cap = cap_for(nusers);
    c->subjects_cap = cap_for(nsubjects);
    c->keys = calloc(c->keys_cap, sizeof(*c->keys));
    c->users = calloc(c->users_cap, sizeof(*c->users));
    c->subjects = calloc(c->subjects_cap, sizeof(*c->subjects));
    if (!c->list || !c->keys || !c->users || !c->subjects) {
        sl_consumers_free(c);
        return NULL;
    }
    c->n = n;
    for (size_t i = 0; i < n; i++) {
        sl_consumer_t *con = &c->list[i];
        con->name = cs[i]->name;
        con->group = cs[i]->group && cs[i]->group[0] ? cs[i]->group : NULL;
        for (size_t k = 0; k < cs[i]->n_api_keys; k++) {
            const Sluice__V1__Consumer__ApiKey *ak = cs[i]->api_keys[k];
            if (ak->sha256.len != 32)
                continue;
            for (size_t s = sha_hash(ak->sha256.data) & (c->keys_cap - 1);;
                 s = (s + 1) & (c->keys_cap - 1)) {
                if (!c->keys[s].sha) {
                    c->keys[s] = (key_slot_t){ak->sha256.data, ak->name, con};
                    break;
                }
                if (memcmp(c->keys[s].sha, ak->sha256.data, 32) == 0)
                    break;
            }
        }
        for (size_t u = 0; u < cs[i]->n_basic_users; u++)
            str_put(c->users, c->users_cap, cstr(cs[i]->basic_users[u]->username),
                    (sl_str_t){"", 0}, cs[i]->basic_users[u]->password_hash, con);
        for (size_t j = 0; j < cs[i]->n_jwt; j++)
            str_put(c->subjects, c->subjects_cap, cstr(cs[i]->jwt[j]->issuer),
                    cstr(cs[i]->jwt[j]->subject), NULL, con);
    }
    return c;
}

void sl_consumers_free(sl_consumers_t *c)
{
    if (!c)
        return;
    free(c->list);
    free(c->keys);
    free(c->users);
    free(c->subjects);
    free(c);
}

/* Whether two SHA-256 digests are equal, in a time that does not depend on
 * where they differ: four 64-bit XORs folded with OR, no early exit
 * (CRYPTO_memcmp does the same a byte at a time, at ten times the cost). */
static int digest_eq(const uint8_t *a, const uint8_t *b)
{
    uint64_t d = 0;
    for (int i = 0; i < 32; i += 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        d |= x ^ y;
    }
    return d == 0;
}

const sl_consumer_t *sl_consumers_by_key(const sl_consumers_t *c, const uint8_t sha[32],
                                         const char **credential)
{
    if (!c)
        return NULL;
    for (size_t s = sha_hash(sha) & (c->keys_cap - 1);; s = (s + 1) & (c->keys_cap - 1)) {
        if (!c->keys[s].sha)
            return NULL;
        if (digest_eq(c->keys[s].sha, sha)) {
            if (credential)
                *credential = c->keys[s].credential;
            return c->keys[s].consumer;
        }
    }
}

const sl_consumer_t *sl_consumers_by_user(const sl_consumers_t *c, sl_str_t user,
                                          const char **password_hash)
{
    const str_slot_t *s = c ? str_get(c->users, c->users_cap, user, (sl_str_t){"", 0}) : NULL;
    if (!s)
        return NULL;
    if (password_hash)
        *password_hash = s->value;
    return s->consumer;
}

const sl_consumer_t *sl_consumers_by_jwt(const sl_consumers_t *c, sl_str_t iss, sl_str_t sub)
{
    const str_slot_t *s = c ? str_get(c->subjects, c->subjects_cap, iss, sub) : NULL;
    return s ? s->consumer : NULL;
}
