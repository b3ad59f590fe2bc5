/*
 * "host:port" / "[v6]:port" listen addresses of the admin listeners (the
 * runtime's --admin, the controller's --rest), parsed one way with errors
 * that name the flag and show an example.
 */
#ifndef SL_HOSTPORT_H
#define SL_HOSTPORT_H

#include <stddef.h>

/*
 * Splits addr into host (an IP literal or a DNS-style name: letters, digits,
 * '.', '-') and port (0..65535). `what` names the flag in errors ("--rest",
 * "admin") and `example_port` is the port shown in examples. Returns 0, or
 * -1 with err set.
 */
int sl_hostport_parse(const char *addr, const char *what, int example_port, char *host,
                      size_t hostlen, unsigned short *port, char *err, size_t errlen);

/*
 * Splits an http:// or https:// URL (the JWKS client's jwksUri, the traffic
 * log sinks' url) into *tls, host (brackets of an IPv6 literal removed),
 * port (the scheme's when absent) and path ("/" when absent). Refuses user
 * info, a path with spaces or '#', a bad port. 0, or -1 with why (a static
 * string).
 */
int sl_url_split(const char *url, int *tls, char *host, size_t hcap, char *port, size_t pcap,
                 char *path, size_t pathcap, const char **why);

#endif
