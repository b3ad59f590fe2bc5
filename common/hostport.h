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

#endif
