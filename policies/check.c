/*
 * An Api's policies compiled for diagnosis (policy.h, sl_policy_check_spec):
 * the controller runs it on every Api it pushes, so that a policy whose
 * compile fails after validation passed (a jwksCaBundle whose certificates
 * do not parse, ...) is named in the Api's status, with its field path,
 * instead of only in the logs of every runtime that fails the Api's routes
 * closed. The Api is still pushed: the runtimes answer its routes 503
 * policy_unavailable, never without the policy.
 *
 * Check mode (sl_policy_env_t.check_only) makes compile decide from the
 * config alone: it starts no thread, opens no connection and reads no file
 * of the runtime's machine, so what depends on the runtime's environment
 * (a Redis client that cannot start, a jwksCaFile) is still reported by the
 * runtime's log only.
 */
#include "policy.h"

#include <stdio.h>
#include <string.h>

/* Compiles one list entry; appends "<where> (<name>): <reason>" to msg
 * when it fails. 1 failed, 0 not. */
static int check_entry(json_t *e, const char *where, const sl_policy_env_t *env, char *msg,
                       size_t msglen)
{
    const char *name = json_string_value(json_object_get(e, "name"));
    const sl_policy_def_t *def = name ? sl_policy_find(name) : NULL;
    if (!def || json_is_true(json_object_get(e, "disabled")))
        return 0; /* validation said so already */
    json_t *config = json_object_get(e, "config");
    json_t *owned = json_is_object(config) ? json_incref(config) : json_object();
    char why[256] = "";
    void *state = owned ? def->compile(owned, env, why, sizeof(why)) : NULL;
    json_decref(owned);
    if (state) {
        if (def->free)
            def->free(state);
        return 0;
    }
    size_t used = strlen(msg);
    if (used + 1 < msglen)
        snprintf(msg + used, msglen - used, "%s%s (%s): %s", used ? "; " : "", where, name,
                 why[0] ? why : "cannot be compiled");
    return 1;
}

int sl_policy_check_spec(json_t *spec, const sl_policy_env_t *env_in, char *msg, size_t msglen)
{
    sl_policy_env_t env = *env_in;
    env.check_only = 1;
    msg[0] = '\0';
    int failed = 0;
    char where[96];
    json_t *list = json_object_get(spec, "policies");
    for (size_t i = 0; i < json_array_size(list); i++) {
        snprintf(where, sizeof(where), "spec.policies[%zu]", i);
        failed += check_entry(json_array_get(list, i), where, &env, msg, msglen);
    }
    json_t *ops = json_object_get(spec, "operations");
    for (size_t o = 0; o < json_array_size(ops); o++) {
        list = json_object_get(json_array_get(ops, o), "policies");
        for (size_t i = 0; i < json_array_size(list); i++) {
            snprintf(where, sizeof(where), "spec.operations[%zu].policies[%zu]", o, i);
            failed += check_entry(json_array_get(list, i), where, &env, msg, msglen);
        }
    }
    return failed;
}
