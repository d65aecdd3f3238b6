/*
 * The hosts of a multi-host job (cluster/hosts.h): the host list and hostfile parsers,
 * one rule per field shared by both (host name, slot count, the table's bounds), and the
 * placement of ranks. Nothing allocates but rk_hosts_load_file, which reads through base's
 * bounded opener (rekindle/fileio.h); inet_pton checks IPv6 addresses.
 */
#include "cluster/hosts.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/msg.h"
#include "rekindle/fileio.h"

#define WHY_MAX 160    /* one reason, without the entry or line it is about */
#define SHOW_MAX 48    /* an entry or field quoted in a message */
#define V6_TEXT_MAX 45 /* the longest IPv6 address text inet_pton takes (no zone) */

/* s[0..len), known to be printable ASCII, for a message: cut to fit dst[cap] with "...". */
static const char *show(char *dst, size_t cap, const char *s, size_t len)
{
    if (len < cap) {
        memcpy(dst, s, len);
        dst[len] = 0;
    } else {
        memcpy(dst, s, cap - 4);
        memcpy(dst + cap - 4, "...", 4);
    }
    return dst;
}

/* What the byte c is, for a message ("a control character (0x09)"), or NULL when it is a
 * printable ASCII character. */
static const char *byte_kind(unsigned char c, char *buf, size_t cap)
{
    if (c == 0)
        snprintf(buf, cap, "a NUL byte");
    else if (c < 0x20 || c == 0x7f)
        snprintf(buf, cap, "a control character (0x%02x)", c);
    else if (c >= 0x80)
        snprintf(buf, cap, "not ASCII (0x%02x)", c);
    else
        return NULL;
    return buf;
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_';
}

/* The IPv6 address s[0..len) in its canonical form into out; false if it is not one. */
static bool v6_take(const char *s, size_t len, char out[RK_HOST_NAME_MAX])
{
    char text[V6_TEXT_MAX + 1];
    unsigned char addr[16];
    if (len == 0 || len > V6_TEXT_MAX)
        return false;
    memcpy(text, s, len);
    text[len] = 0;
    if (inet_pton(AF_INET6, text, addr) != 1)
        return false;
    return inet_ntop(AF_INET6, addr, out, RK_HOST_NAME_MAX) != NULL;
}

/* The host name s[0..len) (printable ASCII without spaces) into out: a name, "[V6]", or in
 * a hostfile (bare_v6) also a V6 address without brackets. False with why[WHY_MAX] if not. */
static bool name_take(const char *s, size_t len, bool bare_v6, char out[RK_HOST_NAME_MAX],
                      char *why)
{
    if (len == 0) {
        snprintf(why, WHY_MAX, "no host name");
        return false;
    }
    if (s[0] == '[') {
        if (len < 2 || s[len - 1] != ']') {
            snprintf(why, WHY_MAX, "a '[' without its ']'");
            return false;
        }
        if (!v6_take(s + 1, len - 2, out)) {
            snprintf(why, WHY_MAX, "not an IPv6 address in brackets (no zone: [fd00::1])");
            return false;
        }
        return true;
    }
    if (bare_v6 && memchr(s, ':', len)) {
        if (!v6_take(s, len, out)) {
            snprintf(why, WHY_MAX,
                     "neither a host name nor an IPv6 address (a hostfile gives slots as "
                     "slots=N)");
            return false;
        }
        return true;
    }
    for (size_t i = 0; i < len; i++)
        if (!name_char(s[i])) {
            snprintf(why, WHY_MAX,
                     "'%c' is not allowed in a host name (letters, digits, '.', '-', '_'; an "
                     "IPv6 address in brackets)",
                     s[i]);
            return false;
        }
    if (len > RK_HOST_NAME_MAX - 1) {
        snprintf(why, WHY_MAX, "a host name of %zu bytes, at most %d", len, RK_HOST_NAME_MAX - 1);
        return false;
    }
    if (s[0] == '-') {
        snprintf(why, WHY_MAX, "a host name does not start with '-'");
        return false;
    }
    memcpy(out, s, len);
    out[len] = 0;
    return true;
}

/* A whole number of decimal digits s[0..len) in [lo, hi]. */
static bool number_take(const char *s, size_t len, int lo, int hi, int *out)
{
    if (len == 0 || len > 9)
        return false;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* Append h to hs, or false with why: the table is full, or the host is in it already. */
static bool host_add(rk_hosts *hs, const rk_host *h, char *why)
{
    for (int i = 0; i < hs->n; i++)
        if (strcasecmp(hs->h[i].name, h->name) == 0) {
            char shown[SHOW_MAX];
            snprintf(why, WHY_MAX, "host %s twice: it is already one of the job's %s",
                     show(shown, sizeof shown, h->name, strlen(h->name)),
                     hs->h[i].spare ? "spare hosts" : "hosts");
            return false;
        }
    if (hs->n >= RK_HOSTS_MAX) {
        snprintf(why, WHY_MAX, "more than %d hosts (spares included)", RK_HOSTS_MAX);
        return false;
    }
    hs->h[hs->n++] = *h;
    return true;
}

/* Undo the appends since n0: the table as it was. */
static void roll_back(rk_hosts *hs, int n0)
{
    if (hs->n > n0)
        memset(&hs->h[n0], 0, (size_t)(hs->n - n0) * sizeof hs->h[0]);
    hs->n = n0;
}

/* ---- the host list ----------------------------------------------------------------------- */

/* One entry e[0..len) of a list into h, or false with why. */
static bool entry_take(const char *e, size_t len, rk_host *h, char *why)
{
    size_t name_len = len;
    const char *slots = NULL; /* after the ':' */
    if (e[0] == '[') {
        const char *rb = memchr(e, ']', len);
        if (!rb) {
            snprintf(why, WHY_MAX, "a '[' without its ']'");
            return false;
        }
        name_len = (size_t)(rb - e) + 1;
        if (name_len < len) {
            if (rb[1] != ':') {
                snprintf(why, WHY_MAX, "after ']' comes ':N' (the slots) or nothing");
                return false;
            }
            slots = rb + 2;
        }
    } else {
        const char *colon = memchr(e, ':', len);
        if (colon) {
            if (memchr(colon + 1, ':', len - (size_t)(colon + 1 - e))) {
                snprintf(why, WHY_MAX, "an IPv6 address is written in brackets: [ADDR]:N");
                return false;
            }
            name_len = (size_t)(colon - e);
            slots = colon + 1;
        }
    }
    if (!name_take(e, name_len, false, h->name, why))
        return false;
    h->slots = 1;
    if (slots) {
        size_t n = len - (size_t)(slots - e);
        char shown[SHOW_MAX];
        if (n == 0) {
            snprintf(why, WHY_MAX, "no slot count after ':'");
            return false;
        }
        if (!number_take(slots, n, 1, RK_HOST_SLOTS_MAX, &h->slots)) {
            snprintf(why, WHY_MAX, "the slot count '%s' is not a whole number in 1..%d",
                     show(shown, sizeof shown, slots, n), RK_HOST_SLOTS_MAX);
            return false;
        }
    }
    return true;
}

int rk_hosts_parse_list(rk_hosts *hs, const char *list, int spare, rk_err *err)
{
    const char *label = spare ? "spare host list" : "host list";
    if (!hs || !list)
        return rk_err_set(err, RK_EINVAL, "rk_hosts_parse_list: hs or list is NULL");
    if (hs->n < 0 || hs->n > RK_HOSTS_MAX)
        return rk_err_set(err, RK_EINVAL, "rk_hosts_parse_list: a table of %d hosts", hs->n);
    if (!*list)
        return rk_err_set(err, RK_EINVAL, "the %s is empty", label);
    /* Every byte first: what follows may quote the list's parts. */
    for (size_t i = 0; list[i]; i++) {
        char kind[48];
        if (list[i] == ' ' || list[i] == '\t')
            return rk_err_set(err, RK_EINVAL,
                              "%s: byte %zu is a %s: entries are separated by ',' without "
                              "spaces",
                              label, i + 1, list[i] == ' ' ? "space" : "tab");
        if (byte_kind((unsigned char)list[i], kind, sizeof kind))
            return rk_err_set(err, RK_EINVAL, "%s: byte %zu is %s", label, i + 1, kind);
    }
    int n0 = hs->n;
    const char *e = list;
    for (int k = 1;; k++) {
        const char *comma = strchr(e, ',');
        size_t len = comma ? (size_t)(comma - e) : strlen(e);
        char why[WHY_MAX], shown[SHOW_MAX];
        rk_host h = {.spare = spare ? 1 : 0};
        if (len == 0) {
            roll_back(hs, n0);
            return rk_err_set(err, RK_EINVAL, "%s entry %d is empty", label, k);
        }
        if (!entry_take(e, len, &h, why) || !host_add(hs, &h, why)) {
            roll_back(hs, n0);
            return rk_err_set(err, RK_EINVAL, "%s entry %d ('%s'): %s", label, k,
                              show(shown, sizeof shown, e, len), why);
        }
        if (!comma)
            break;
        e = comma + 1;
    }
    return RK_OK;
}

/* ---- the hostfile ------------------------------------------------------------------------ */

static bool blank(char c)
{
    return c == ' ' || c == '\t';
}

/* The keywords of a hostfile line after its host. */
enum { KW_SLOTS, KW_MAX_SLOTS, KW_UNKNOWN };

static int keyword(const char *s, size_t len)
{
    if (len == 5 && memcmp(s, "slots", 5) == 0)
        return KW_SLOTS;
    if (len == 9 && (memcmp(s, "max_slots", 9) == 0 || memcmp(s, "max-slots", 9) == 0))
        return KW_MAX_SLOTS;
    return KW_UNKNOWN;
}

/* One line p[0..len) (without its newline) of a hostfile: nothing (blank, a comment), or one
 * host into h (*got set). False with why otherwise. */
static bool line_take(const char *p, size_t len, rk_host *h, bool *got, char *why)
{
    *got = false;
    size_t end = len; /* where the comment starts */
    for (size_t i = 0; i < len; i++) {
        char kind[48];
        if (p[i] == 0) {
            snprintf(why, WHY_MAX, "byte %zu is a NUL byte (not a text file?)", i + 1);
            return false;
        }
        if (i < end && p[i] == '#')
            end = i;
        if (i < end && !blank(p[i]) && byte_kind((unsigned char)p[i], kind, sizeof kind)) {
            snprintf(why, WHY_MAX, "byte %zu is %s", i + 1, kind);
            return false;
        }
    }
    size_t q = 0;
    while (q < end && blank(p[q]))
        q++;
    if (q == end)
        return true;
    size_t f = q;
    while (q < end && !blank(p[q]))
        q++;
    if (!name_take(p + f, q - f, true, h->name, why))
        return false;
    int slots = 0, max_slots = 0; /* 0: not given */
    char shown[SHOW_MAX];
    for (;;) {
        while (q < end && blank(p[q]))
            q++;
        if (q == end)
            break;
        size_t k = q;
        while (q < end && !blank(p[q]) && p[q] != '=')
            q++;
        size_t klen = q - k;
        while (q < end && blank(p[q]))
            q++;
        if (klen == 0) {
            snprintf(why, WHY_MAX, "an '=' without a keyword before it");
            return false;
        }
        if (q == end || p[q] != '=') {
            snprintf(why, WHY_MAX, "'%s' after the host is not KEYWORD=VALUE (one host a line)",
                     show(shown, sizeof shown, p + k, klen));
            return false;
        }
        int kw = keyword(p + k, klen);
        if (kw == KW_UNKNOWN) {
            snprintf(why, WHY_MAX, "unknown keyword '%s' (slots=N and max_slots=N are known)",
                     show(shown, sizeof shown, p + k, klen));
            return false;
        }
        const char *kname = kw == KW_SLOTS ? "slots" : "max_slots";
        q++;
        while (q < end && blank(p[q]))
            q++;
        size_t v = q;
        while (q < end && !blank(p[q]))
            q++;
        if (q == v) {
            snprintf(why, WHY_MAX, "%s= without a value", kname);
            return false;
        }
        int *dst = kw == KW_SLOTS ? &slots : &max_slots;
        if (*dst) {
            snprintf(why, WHY_MAX, "%s given twice", kname);
            return false;
        }
        int hi = kw == KW_SLOTS ? RK_HOST_SLOTS_MAX : 999999999;
        if (!number_take(p + v, q - v, 1, hi, dst)) {
            if (kw == KW_SLOTS)
                snprintf(why, WHY_MAX, "slots '%s' is not a whole number in 1..%d",
                         show(shown, sizeof shown, p + v, q - v), RK_HOST_SLOTS_MAX);
            else
                snprintf(why, WHY_MAX, "max_slots '%s' is not a whole number from 1",
                         show(shown, sizeof shown, p + v, q - v));
            return false;
        }
    }
    h->slots = slots ? slots : 1;
    if (max_slots && max_slots < h->slots) {
        snprintf(why, WHY_MAX, "max_slots %d is less than the %d slots", max_slots, h->slots);
        return false;
    }
    *got = true;
    return true;
}

int rk_hosts_parse_text(rk_hosts *hs, const char *text, size_t len, const char *what, rk_err *err)
{
    if (!what)
        what = "hostfile";
    if (!hs || (!text && len))
        return rk_err_set(err, RK_EINVAL, "rk_hosts_parse_text: hs or text is NULL");
    if (hs->n < 0 || hs->n > RK_HOSTS_MAX)
        return rk_err_set(err, RK_EINVAL, "rk_hosts_parse_text: a table of %d hosts", hs->n);
    int n0 = hs->n;
    const char *p = text, *end = text + len;
    for (size_t line = 1; p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (le > p && le[-1] == '\r')
            le--;
        char why[WHY_MAX];
        rk_host h = {0};
        bool got;
        if (!line_take(p, (size_t)(le - p), &h, &got, why) || (got && !host_add(hs, &h, why))) {
            roll_back(hs, n0);
            return rk_err_set_line(err, RK_EFORMAT, "%s: line %zu: %s", what, line, why);
        }
        p = nl ? nl + 1 : end;
    }
    if (hs->n == n0)
        return rk_err_set_line(err, RK_EFORMAT, "%s: no host in it (only blank lines and comments)",
                               what);
    return RK_OK;
}

int rk_hosts_load_file(rk_hosts *hs, const char *path, rk_err *err)
{
    if (!hs || !path || !*path)
        return rk_err_set(err, RK_EINVAL, "rk_hosts_load_file: hs or path is empty");
    char what[300], shown[256];
    snprintf(what, sizeof what, "hostfile %s", rk_msg_show(shown, sizeof shown, path));
    int fd;
    uint64_t size;
    int rc = rk_file_open_read_nofollow(path, what, (size_t)RK_HOSTFILE_MAX, &fd, &size, err);
    if (rc < 0)
        return rc;
    uint8_t *buf;
    size_t len;
    rc = rk_file_read_fd(fd, what, (size_t)RK_HOSTFILE_MAX, size, &buf, &len, err);
    close(fd);
    if (rc < 0)
        return rc;
    rc = rk_hosts_parse_text(hs, (const char *)buf, len, what, err);
    free(buf);
    return rc;
}

/* ---- placement --------------------------------------------------------------------------- */

static bool usable(const rk_hosts *hs, const unsigned char *excluded, int i, int spare)
{
    return !(excluded && excluded[i]) && (hs->h[i].spare != 0) == (spare != 0);
}

int rk_hosts_slots(const rk_hosts *hs, const unsigned char *excluded, int with_spares)
{
    if (!hs || hs->n < 0 || hs->n > RK_HOSTS_MAX)
        return 0;
    int total = 0;
    for (int spare = 0; spare <= (with_spares ? 1 : 0); spare++)
        for (int i = 0; i < hs->n; i++)
            if (usable(hs, excluded, i, spare) && hs->h[i].slots > 0)
                total += hs->h[i].slots;
    return total;
}

int rk_hosts_place(const rk_hosts *hs, const unsigned char *excluded, int nranks, int *host_of,
                   int *local_of, rk_err *err)
{
    if (!hs || !host_of || !local_of || hs->n < 0 || hs->n > RK_HOSTS_MAX)
        return rk_err_set(err, RK_EINVAL, "rk_hosts_place: no table or no arrays");
    if (nranks < 1)
        return rk_err_set(err, RK_EINVAL, "rk_hosts_place: %d ranks", nranks);
    int have = rk_hosts_slots(hs, excluded, 1);
    if (nranks > have) {
        bool spares = rk_hosts_slots(hs, excluded, 0) < have;
        return rk_err_set(err, RK_EINVAL,
                          "%d rank%s need%s %d slot%s; the hosts not excluded have %d%s", nranks,
                          nranks == 1 ? "" : "s", nranks == 1 ? "s" : "", nranks,
                          nranks == 1 ? "" : "s", have, spares ? ", spares included" : "");
    }
    int r = 0, used = 0;
    for (int spare = 0; spare <= 1 && r < nranks; spare++)
        for (int i = 0; i < hs->n && r < nranks; i++) {
            if (!usable(hs, excluded, i, spare) || hs->h[i].slots <= 0)
                continue;
            for (int k = 0; k < hs->h[i].slots && r < nranks; k++, r++) {
                host_of[r] = i;
                local_of[r] = k;
            }
            used++;
        }
    return used;
}

const char *rk_hosts_describe(const rk_hosts *hs, char *buf, size_t cap)
{
    if (cap == 0)
        return buf;
    buf[0] = 0;
    size_t pos = 0;
    bool cut = false;
    int n = hs && hs->n > 0 ? (hs->n < RK_HOSTS_MAX ? hs->n : RK_HOSTS_MAX) : 0;
    for (int i = 0; i < n && !cut; i++) {
        const rk_host *h = &hs->h[i];
        bool v6 = strchr(h->name, ':') != NULL;
        int w = snprintf(buf + pos, cap - pos, "%s%s%.*s%s:%d", i ? "," : "", v6 ? "[" : "",
                         RK_HOST_NAME_MAX - 1, h->name, v6 ? "]" : "", h->slots);
        if (w < 0 || (size_t)w >= cap - pos)
            cut = true;
        else
            pos += (size_t)w;
    }
    if (cut && cap >= 4)
        memcpy(buf + cap - 4, "...", 4);
    return buf;
}
