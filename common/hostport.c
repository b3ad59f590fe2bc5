/*
 * Listen address parsing (hostport.h).
 */
#include "hostport.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

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
            snprintf(err, errlen, "%s %s: IPv6 addresses need brackets, e.g. [::1]:%d", what, addr,
                     example_port);
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
    snprintf(err, errlen, "%s %s: invalid host; use an IP address such as 127.0.0.1 or [::1]", what,
             addr);
    return -1;
bad_port:
    snprintf(err, errlen, "%s %s: invalid port; use a number from 0 to 65535", what, addr);
    return -1;
}

int sl_url_split(const char *url, int *tls, char *host, size_t hcap, char *port, size_t pcap,
                 char *path, size_t pathcap, const char **why)
{
    const char *h;
    if (strncasecmp(url, "http://", 7) == 0) {
        *tls = 0;
        h = url + 7;
    } else if (strncasecmp(url, "https://", 8) == 0) {
        *tls = 1;
        h = url + 8;
    } else {
        *why = "must start with http:// or https://";
        return -1;
    }
    const char *slash = strchr(h, '/');
    size_t hp = slash ? (size_t)(slash - h) : strlen(h);
    const char *p = slash ? slash : "/";
    if (strlen(p) >= pathcap || strpbrk(p, " \t\r\n#")) {
        *why = "the path must be under 1024 characters, without spaces or '#'";
        return -1;
    }
    if (memchr(h, '@', hp)) {
        *why = "credentials in the URL are not supported (use auth)";
        return -1;
    }
    const char *hs = h, *he, *colon;
    if (hp && h[0] == '[') {
        const char *rb = memchr(h, ']', hp);
        if (!rb) {
            *why = "an IPv6 address needs a closing ']'";
            return -1;
        }
        hs = h + 1;
        he = rb;
        colon = rb + 1 < h + hp && rb[1] == ':' ? rb + 1 : NULL;
    } else {
        colon = memchr(h, ':', hp);
        he = colon ? colon : h + hp;
    }
    size_t hl = (size_t)(he - hs);
    if (hl == 0 || hl >= hcap) {
        *why = "the host is missing or too long";
        return -1;
    }
    memcpy(host, hs, hl);
    host[hl] = '\0';
    const char *ps = colon ? colon + 1 : NULL;
    size_t pl = ps ? (size_t)(h + hp - ps) : 0;
    if (ps) {
        if (pl == 0 || pl >= pcap) {
            *why = "the port is missing or invalid";
            return -1;
        }
        long n = 0;
        for (size_t i = 0; i < pl; i++) {
            if (ps[i] < '0' || ps[i] > '9') {
                *why = "the port must be a number";
                return -1;
            }
            n = n * 10 + (ps[i] - '0');
        }
        if (n < 1 || n > 65535) {
            *why = "the port must be 1..65535";
            return -1;
        }
        memcpy(port, ps, pl);
        port[pl] = '\0';
    } else {
        snprintf(port, pcap, "%s", *tls ? "443" : "80");
    }
    snprintf(path, pathcap, "%s", p);
    return 0;
}
