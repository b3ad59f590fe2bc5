/*
 * Listen address parsing (hostport.h).
 */
#include "hostport.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

int sl_hostport_parse(const char *addr, const char *what, int example_port, char *host,
                      size_t hostlen, unsigned short *port, char *err, size_t errlen)
{
    const char *port_str;
    size_t hlen;
    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (!close || close[1] != ':') {
            snprintf(err, errlen, "%s %s: expected [ipv6]:port, e.g. [::1]:%d", what, addr,
                     example_port);
            return -1;
        }
        hlen = (size_t)(close - addr - 1);
        if (hlen == 0 || hlen >= hostlen)
            goto bad_host;
        memcpy(host, addr + 1, hlen);
        host[hlen] = '\0';
        struct in6_addr a6;
        if (inet_pton(AF_INET6, host, &a6) != 1)
            goto bad_host;
        port_str = close + 2;
    } else {
        const char *colon = strrchr(addr, ':');
        if (!colon) {
            snprintf(err, errlen, "%s %s: expected host:port, e.g. 127.0.0.1:%d", what, addr,
                     example_port);
            return -1;
        }
        if (memchr(addr, ':', (size_t)(colon - addr))) {
            snprintf(err, errlen, "%s %s: IPv6 addresses need brackets, e.g. [::1]:%d", what,
                     addr, example_port);
            return -1;
        }
        hlen = (size_t)(colon - addr);
        if (hlen == 0 || hlen >= hostlen)
            goto bad_host;
        memcpy(host, addr, hlen);
        host[hlen] = '\0';
        for (const char *p = host; *p; p++) {
            /* An address or a DNS name ("localhost"); nothing else reaches
             * getaddrinfo. */
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                  (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'))
                goto bad_host;
        }
        port_str = colon + 1;
    }
    unsigned long v = 0;
    if (*port_str == '\0' || strlen(port_str) > 5)
        goto bad_port;
    for (const char *p = port_str; *p; p++) {
        if (*p < '0' || *p > '9')
            goto bad_port;
        v = v * 10 + (unsigned long)(*p - '0');
    }
    if (v > 65535)
        goto bad_port;
    *port = (unsigned short)v;
    return 0;

bad_host:
    snprintf(err, errlen, "%s %s: invalid host; use an IP address such as 127.0.0.1 or [::1]",
             what, addr);
    return -1;
bad_port:
    snprintf(err, errlen, "%s %s: invalid port; use a number from 0 to 65535", what, addr);
    return -1;
}
