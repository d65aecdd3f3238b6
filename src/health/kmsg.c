/*
 * Xids since boot from the kernel log (health/kmsg.h): the /dev/kmsg record and journal
 * export parsers, the NVRM Xid line, and the per (bus id, code) counts. Relies on the bounded
 * opener (rekindle/fileio.h) for RK_KMSG_PATH and on base/proc.h to run journalctl.
 */
#define _GNU_SOURCE
#include "health/kmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/env.h"
#include "base/proc.h"
#include "rekindle/fileio.h"

#define BUS_LEN 20
#define CURSOR_MAX 512

typedef struct pair {
    char bus[BUS_LEN];
    int xid;
    uint64_t count;
    uint64_t last; /* the ordinal of its latest event (rk_kmsg.tick) */
} pair;

enum { SRC_NONE, SRC_FILE, SRC_DEVICE, SRC_JOURNAL };

struct rk_kmsg {
    bool chosen;
    int src;
    int fd;            /* the device, kept open */
    char path[4096];   /* the RK_KMSG_PATH file */
    bool seen_any;     /* a record with a sequence number was taken */
    uint64_t last_seq; /* the highest sequence number taken */
    uint64_t tick;     /* counted events, in order */
    pair pairs[RK_KMSG_PAIRS_MAX];
    int npairs;
    uint64_t dropped;
    char cursor[CURSOR_MAX]; /* the journal's last entry */
    bool journal_ok;         /* journalctl ran well once */
    char dev_note[100];      /* why the device could not be read */
    char jnote[100];         /* why journalctl failed */
    char note[200];
    char rec[RK_KMSG_LINE_MAX + 1]; /* one device record */
};

/* ---- parsers -------------------------------------------------------------------------------- */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Hex digits s[*i..) up to a character not one: at least 1, at most maxd digits. */
static int hex_part(const char *s, size_t len, size_t *i, int maxd, unsigned long *v)
{
    int d = 0;
    *v = 0;
    while (*i < len && hexval(s[*i]) >= 0) {
        if (++d > maxd)
            return -1;
        *v = *v * 16 + (unsigned long)hexval(s[*i]);
        (*i)++;
    }
    return d ? 0 : -1;
}

int rk_kmsg_bus_id_norm(const char *s, size_t len, char *out, size_t cap)
{
    unsigned long part[3], fn = 0;
    int nparts = 0;
    size_t i = 0;
    if (cap < 17)
        return -1;
    for (;;) {
        if (nparts == 3 || hex_part(s, len, &i, 8, &part[nparts]) != 0)
            return -1;
        nparts++;
        if (i < len && s[i] == ':') {
            i++;
            continue;
        }
        break;
    }
    if (i < len && s[i] == '.') {
        i++;
        if (hex_part(s, len, &i, 1, &fn) != 0)
            return -1;
    }
    if (i != len || nparts < 2)
        return -1;
    unsigned long dom = nparts == 3 ? part[0] : 0;
    unsigned long bus = part[nparts - 2], dev = part[nparts - 1];
    if (dom > 0xffffffffUL || bus > 0xff || dev > 0x1f || fn > 7)
        return -1;
    snprintf(out, cap, "%08lx:%02lx:%02lx.%lx", dom, bus, dev, fn);
    return 0;
}

/* A decimal number s[*i..) of at most 20 digits that fits uint64_t. */
static int dec_part(const char *s, size_t len, size_t *i, uint64_t *v)
{
    size_t start = *i;
    *v = 0;
    while (*i < len && s[*i] >= '0' && s[*i] <= '9') {
        unsigned d = (unsigned)(s[*i] - '0');
        if (*v > (UINT64_MAX - d) / 10)
            return -1;
        *v = *v * 10 + d;
        (*i)++;
    }
    return *i > start ? 0 : -1;
}

int rk_kmsg_parse_record(const char *line, size_t len, rk_kmsg_record *out)
{
    size_t i = 0;
    uint64_t pri, seq, ts;
    memset(out, 0, sizeof *out);
    if (dec_part(line, len, &i, &pri) || pri > 1023 || i >= len || line[i++] != ',')
        return -1;
    if (dec_part(line, len, &i, &seq) || i >= len || line[i++] != ',')
        return -1;
    if (dec_part(line, len, &i, &ts) || i >= len || line[i++] != ',')
        return -1;
    /* FLAGS: '-' (alone), 'c' (continuation start) or '+' (fragment); further comma fields
     * (a caller id on newer kernels) up to the ';' */
    if (i >= len || !(line[i] == '-' || line[i] == 'c' || line[i] == '+'))
        return -1;
    i++;
    if (i < len && line[i] == ',') {
        while (i < len && line[i] != ';') {
            unsigned char c = (unsigned char)line[i];
            if (c < 0x21 || c > 0x7e)
                return -1;
            i++;
        }
    }
    if (i >= len || line[i] != ';')
        return -1;
    i++;
    out->facility = (int)(pri >> 3);
    out->level = (int)(pri & 7);
    out->seq = seq;
    out->ts_usec = ts;
    out->msg = line + i;
    out->msg_len = len - i;
    return 0;
}

static bool starts(const char *s, size_t len, size_t i, const char *lit)
{
    size_t n = strlen(lit);
    return len - i >= n && memcmp(s + i, lit, n) == 0;
}

int rk_kmsg_parse_xid(const char *msg, size_t len, char *bus_id, size_t cap, int *xid)
{
    size_t i = 0;
    while (i < len && msg[i] == ' ')
        i++;
    if (!starts(msg, len, i, "NVRM: Xid (PCI:"))
        return 0;
    i += strlen("NVRM: Xid (PCI:");
    size_t b = i;
    while (i < len && i - b <= 24 && (hexval(msg[i]) >= 0 || msg[i] == ':' || msg[i] == '.'))
        i++;
    if (!starts(msg, len, i, "): "))
        return 0;
    if (rk_kmsg_bus_id_norm(msg + b, i - b, bus_id, cap) != 0)
        return 0;
    i += 3;
    uint64_t code;
    size_t c = i;
    if (dec_part(msg, len, &i, &code) || i - c > 5 || code == 0 || code > RK_KMSG_XID_MAX)
        return 0;
    if (i < len && msg[i] != ',' && msg[i] != ' ')
        return 0;
    *xid = (int)code;
    return 1;
}

/* ---- counting ------------------------------------------------------------------------------- */

static pair *find_pair(const rk_kmsg *k, const char *bus, int xid)
{
    for (int j = 0; j < k->npairs; j++)
        if (k->pairs[j].xid == xid && strcmp(k->pairs[j].bus, bus) == 0)
            return (pair *)&k->pairs[j];
    return NULL;
}

static void count_xid(rk_kmsg *k, const char *bus, int xid)
{
    pair *p = find_pair(k, bus, xid);
    if (!p) {
        if (k->npairs == RK_KMSG_PAIRS_MAX) {
            k->dropped++;
            return;
        }
        p = &k->pairs[k->npairs++];
        memset(p, 0, sizeof *p);
        snprintf(p->bus, sizeof p->bus, "%s", bus);
        p->xid = xid;
    }
    p->count++;
    p->last = ++k->tick;
}

/* One kernel record's message: counted when it is an Xid line of the kernel facility. */
static void take_message(rk_kmsg *k, int facility, const char *msg, size_t len)
{
    char bus[BUS_LEN];
    int xid;
    if (facility == 0 && rk_kmsg_parse_xid(msg, len, bus, sizeof bus, &xid) == 1)
        count_xid(k, bus, xid);
}

/* A record with sequence number seq: false when it was taken before. */
static bool new_seq(rk_kmsg *k, uint64_t seq)
{
    if (k->seen_any && seq <= k->last_seq)
        return false;
    k->seen_any = true;
    k->last_seq = seq;
    return true;
}

/* One pass over kmsg-format text: check only (commit false) or count (commit true). */
static int feed_pass(rk_kmsg *k, const char *label, const char *text, size_t len, bool commit,
                     rk_err *err)
{
    size_t pos = 0;
    long line = 0, taken = 0;
    bool had_record = false;
    /* the check reads all of it (the text is bounded by its reader); the count stops after
     * RK_KMSG_RECORDS_MAX new records, the rest is taken by the next read */
    while (pos < len && taken < RK_KMSG_RECORDS_MAX) {
        line++;
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        size_t n = end - pos;
        const char *l = text + pos;
        pos = nl ? end + 1 : len;
        if (n > RK_KMSG_LINE_MAX)
            return rk_err_set(err, RK_EFORMAT, "%s: line %ld: longer than %d bytes", label, line,
                              RK_KMSG_LINE_MAX);
        if (memchr(l, '\0', n))
            return rk_err_set(err, RK_EFORMAT, "%s: line %ld: a NUL byte", label, line);
        if (n == 0)
            continue;
        if (l[0] == ' ') { /* " KEY=VALUE" of the record before */
            if (!had_record)
                return rk_err_set(err, RK_EFORMAT,
                                  "%s: line %ld: a continuation line before any record", label,
                                  line);
            continue;
        }
        rk_kmsg_record r;
        if (rk_kmsg_parse_record(l, n, &r) != 0)
            return rk_err_set(err, RK_EFORMAT,
                              "%s: line %ld: not a kernel log record "
                              "(PRI,SEQ,TS_USEC,FLAGS;MESSAGE)",
                              label, line);
        had_record = true;
        if (commit && new_seq(k, r.seq)) {
            take_message(k, r.facility, r.msg, r.msg_len);
            taken++;
        }
    }
    return RK_OK;
}

int rk_kmsg_feed(rk_kmsg *k, const char *label, const char *text, size_t len, rk_err *err)
{
    if (!label)
        label = "kernel log";
    int rc = feed_pass(k, label, text, len, false, err);
    if (rc)
        return rc;
    return feed_pass(k, label, text, len, true, err);
}

/* ---- journal export format ------------------------------------------------------------------ */

typedef struct jentry {
    bool has_fac, fac0, has_transport, kernel, has_msg;
    const char *msg;
    size_t msg_len;
    const char *cursor;
    size_t cursor_len;
} jentry;

static void jfield(jentry *e, const char *name, size_t nlen, const char *v, size_t vlen)
{
#define IS(lit) (nlen == strlen(lit) && memcmp(name, lit, nlen) == 0)
    if (IS("SYSLOG_FACILITY")) {
        e->has_fac = true;
        e->fac0 = vlen == 1 && v[0] == '0';
    } else if (IS("_TRANSPORT")) {
        e->has_transport = true;
        e->kernel = vlen == 6 && memcmp(v, "kernel", 6) == 0;
    } else if (IS("MESSAGE")) {
        e->has_msg = true;
        e->msg = v;
        e->msg_len = vlen;
    } else if (IS("__CURSOR")) {
        e->cursor = v;
        e->cursor_len = vlen;
    }
#undef IS
}

static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 64 || (s[0] >= '0' && s[0] <= '9'))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return false;
    return true;
}

static bool cursor_ok(const char *s, size_t n)
{
    if (n == 0 || n >= CURSOR_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return false;
    return true;
}

/* One pass over export text, as feed_pass. */
static int export_pass(rk_kmsg *k, const char *label, const char *text, size_t len, bool complete,
                       bool commit, rk_err *err)
{
    size_t pos = 0;
    long entry = 0;
    while (pos < len && entry < RK_KMSG_RECORDS_MAX) {
        jentry e = {0};
        entry++;
        bool ended = false, cut = false;
        int fields = 0;
        while (pos < len) {
            if (text[pos] == '\n') { /* the empty line that ends the entry */
                pos++;
                ended = true;
                break;
            }
            size_t ns = pos;
            while (pos < len && text[pos] != '=' && text[pos] != '\n' && pos - ns <= 64)
                pos++;
            if (pos >= len) {
                cut = true;
                break;
            }
            if (!name_ok(text + ns, pos - ns))
                return rk_err_set(err, RK_EFORMAT, "%s: entry %ld: a field name that is not one",
                                  label, entry);
            size_t nlen = pos - ns;
            const char *v;
            size_t vlen;
            if (text[pos] == '=') {
                v = text + ++pos;
                const char *nl = memchr(v, '\n', len - pos);
                if (!nl) {
                    cut = true;
                    break;
                }
                vlen = (size_t)(nl - v);
                pos += vlen + 1;
            } else { /* binary: NAME\n, 64-bit little-endian size, the bytes, \n */
                pos++;
                if (len - pos < 8) {
                    cut = true;
                    break;
                }
                uint64_t sz = 0;
                for (int b = 7; b >= 0; b--)
                    sz = sz << 8 | (unsigned char)text[pos + (size_t)b];
                pos += 8;
                if (sz > RK_KMSG_LINE_MAX)
                    return rk_err_set(err, RK_EFORMAT,
                                      "%s: entry %ld: a binary field of %llu bytes (at most %d)",
                                      label, entry, (unsigned long long)sz, RK_KMSG_LINE_MAX);
                if (len - pos < sz + 1) {
                    cut = true;
                    break;
                }
                v = text + pos;
                vlen = (size_t)sz;
                pos += vlen;
                if (text[pos] != '\n')
                    return rk_err_set(err, RK_EFORMAT,
                                      "%s: entry %ld: a binary field not ended by a newline", label,
                                      entry);
                pos++;
            }
            if (vlen > RK_KMSG_LINE_MAX)
                return rk_err_set(err, RK_EFORMAT, "%s: entry %ld: a field longer than %d bytes",
                                  label, entry, RK_KMSG_LINE_MAX);
            if (++fields > 256)
                return rk_err_set(err, RK_EFORMAT, "%s: entry %ld: more than 256 fields", label,
                                  entry);
            jfield(&e, text + ns, nlen, v, vlen);
        }
        if (!ended || cut) {
            if (!complete)
                break; /* the output was cut: this entry waits for the next run */
            return rk_err_set(err, RK_EFORMAT, "%s: entry %ld: ends without its empty line", label,
                              entry);
        }
        if (fields == 0)
            return rk_err_set(err, RK_EFORMAT, "%s: entry %ld: empty", label, entry);
        if (!e.cursor || !cursor_ok(e.cursor, e.cursor_len))
            return rk_err_set(err, RK_EFORMAT, "%s: entry %ld: no __CURSOR, or one that is not one",
                              label, entry);
        if (commit) {
            if (e.has_fac && e.fac0 && (!e.has_transport || e.kernel) && e.has_msg)
                take_message(k, 0, e.msg, e.msg_len);
            memcpy(k->cursor, e.cursor, e.cursor_len);
            k->cursor[e.cursor_len] = '\0';
        }
    }
    return RK_OK;
}

int rk_kmsg_feed_export(rk_kmsg *k, const char *label, const char *text, size_t len, bool complete,
                        rk_err *err)
{
    if (!label)
        label = "journal";
    int rc = export_pass(k, label, text, len, complete, false, err);
    if (rc)
        return rc;
    return export_pass(k, label, text, len, complete, true, err);
}

/* ---- sources -------------------------------------------------------------------------------- */

int rk_kmsg_create(rk_kmsg **out, rk_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return rk_err_set(err, RK_ENOMEM, "kernel log: out of memory");
    (*out)->fd = -1;
    return RK_OK;
}

void rk_kmsg_free(rk_kmsg *k)
{
    if (!k)
        return;
    if (k->fd >= 0)
        close(k->fd);
    free(k);
}

static int read_file(rk_kmsg *k, rk_err *err)
{
    uint8_t *buf;
    size_t len;
    int rc = rk_file_read_all(k->path, &buf, &len, RK_KMSG_FILE_MAX, err);
    if (rc)
        return rc;
    rc = rk_kmsg_feed(k, k->path, (const char *)buf, len, err);
    free(buf);
    return rc;
}

/* The device: one record per read(), EAGAIN at the end, EPIPE when the ring overwrote
 * records we had not read yet (the next read goes on from the oldest left). */
static int read_device(rk_kmsg *k)
{
    char *buf = k->rec;
    for (long n = 0; n < RK_KMSG_RECORDS_MAX; n++) {
        ssize_t got = read(k->fd, buf, RK_KMSG_LINE_MAX);
        if (got < 0 && (errno == EINTR || errno == EPIPE))
            continue;
        if (got < 0 && errno == EINVAL) /* a record longer than the buffer: skipped */
            continue;
        if (got <= 0)
            break; /* EAGAIN: nothing more now */
        const char *nl = memchr(buf, '\n', (size_t)got);
        size_t hl = nl ? (size_t)(nl - buf) : (size_t)got;
        rk_kmsg_record r;
        if (rk_kmsg_parse_record(buf, hl, &r) == 0 && new_seq(k, r.seq))
            take_message(k, r.facility, r.msg, r.msg_len);
    }
    return RK_OK;
}

int rk_kmsg_read_journal(rk_kmsg *k, rk_err *err)
{
    char after[CURSOR_MAX + 16];
    char *argv[12];
    int a = 0;
    argv[a++] = "journalctl";
    argv[a++] = "-k";
    argv[a++] = "-b";
    argv[a++] = "-q";
    argv[a++] = "--no-pager";
    argv[a++] = "-o";
    argv[a++] = "export";
    argv[a++] = "--output-fields=MESSAGE,SYSLOG_FACILITY,_TRANSPORT";
    if (k->cursor[0]) {
        snprintf(after, sizeof after, "--after-cursor=%s", k->cursor);
        argv[a++] = after;
    }
    argv[a] = NULL;
    char *out = malloc(RK_KMSG_JOURNAL_MAX + 1);
    if (!out)
        return rk_err_set(err, RK_ENOMEM, "kernel log: out of memory for journalctl's output");
    int st = rk_proc_run(argv, out, RK_KMSG_JOURNAL_MAX + 1, RK_KMSG_JOURNAL_WAIT_S,
                         RK_PROC_STDERR_NULL);
    int rc = RK_OK;
    if (st == 0 || st == RK_PROC_TOO_LONG) {
        rc = rk_kmsg_feed_export(k, "journalctl -k -o export", out, strlen(out), st == 0, err);
    } else {
        snprintf(k->jnote, sizeof k->jnote, "journalctl -k %s",
                 st == -1    ? "timed out"
                 : st == 127 ? "not found"
                             : "failed");
        rc = rk_err_set(err, RK_EIO, "kernel log: %s", k->jnote);
    }
    free(out);
    return rc;
}

static void choose(rk_kmsg *k)
{
    k->chosen = true;
    const char *p = rk_env_override(RK_KMSG_ENV);
    if (p && p[0]) {
        snprintf(k->path, sizeof k->path, "%s", p);
        k->src = SRC_FILE;
        return;
    }
    int fd = open(RK_KMSG_DEVICE, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISCHR(st.st_mode)) {
        k->fd = fd;
        k->src = SRC_DEVICE;
        return;
    }
    int e = fd >= 0 ? ENOTTY : errno;
    if (fd >= 0)
        close(fd);
    k->src = SRC_JOURNAL;
    snprintf(k->dev_note, sizeof k->dev_note, "%s: %s", RK_KMSG_DEVICE,
             e == ENOTTY ? "not a character device" : strerror(e));
}

int rk_kmsg_read(rk_kmsg *k, rk_err *err)
{
    if (!k->chosen)
        choose(k);
    switch (k->src) {
    case SRC_FILE: return read_file(k, err);
    case SRC_DEVICE: return read_device(k);
    case SRC_JOURNAL: {
        rk_err e = {0};
        int rc = rk_kmsg_read_journal(k, &e);
        if (rc == RK_ENOMEM) {
            if (err)
                *err = e;
            return rc;
        }
        if (rc && !k->journal_ok) { /* neither works: say why, count nothing, try no more */
            snprintf(k->note, sizeof k->note, "%.90s; %.90s", k->dev_note,
                     rc == RK_EIO ? k->jnote : e.msg);
            k->src = SRC_NONE;
        } else if (!rc) {
            k->journal_ok = true; /* a later run that fails takes nothing new, that is all */
        }
        return RK_OK;
    }
    }
    return RK_OK;
}

const char *rk_kmsg_source(const rk_kmsg *k)
{
    switch (k->src) {
    case SRC_FILE: return k->path;
    case SRC_DEVICE: return RK_KMSG_DEVICE;
    case SRC_JOURNAL: return k->journal_ok ? "journalctl" : NULL;
    }
    return NULL;
}

const char *rk_kmsg_note(const rk_kmsg *k)
{
    return rk_kmsg_source(k) ? "" : k->note;
}

uint64_t rk_kmsg_count(const rk_kmsg *k, const char *bus_id, int xid)
{
    char bus[BUS_LEN];
    if (rk_kmsg_bus_id_norm(bus_id, strlen(bus_id), bus, sizeof bus) != 0)
        return 0;
    const pair *p = find_pair(k, bus, xid);
    return p ? p->count : 0;
}

uint64_t rk_kmsg_dropped(const rk_kmsg *k)
{
    return k->dropped;
}

/* ---- merging -------------------------------------------------------------------------------- */

static int by_count(const void *x, const void *y)
{
    const pair *a = *(const pair *const *)x, *b = *(const pair *const *)y;
    if (a->count != b->count)
        return a->count < b->count ? 1 : -1;
    return (a->xid > b->xid) - (a->xid < b->xid);
}

void rk_kmsg_merge(const rk_kmsg *k, const rk_gpu_info *infos, rk_gpu_sample *samples, int n)
{
    if (!k || !rk_kmsg_source(k))
        return;
    for (int i = 0; i < n; i++) {
        rk_gpu_sample *s = &samples[i];
        char bus[BUS_LEN];
        if (s->lost || s->valid == 0 ||
            rk_kmsg_bus_id_norm(infos[i].bus_id, strlen(infos[i].bus_id), bus, sizeof bus) != 0)
            continue;
        const pair *mine[RK_KMSG_PAIRS_MAX];
        int m = 0;
        uint64_t total = 0, latest = 0;
        int last = 0;
        for (int j = 0; j < k->npairs; j++)
            if (strcmp(k->pairs[j].bus, bus) == 0) {
                mine[m++] = &k->pairs[j];
                total += k->pairs[j].count;
                if (k->pairs[j].last > latest) {
                    latest = k->pairs[j].last;
                    last = k->pairs[j].xid;
                }
            }
        qsort(mine, (size_t)m, sizeof mine[0], by_count);
        s->nxids = m < RK_XID_SLOTS ? m : RK_XID_SLOTS;
        for (int j = 0; j < s->nxids; j++) {
            s->xids[j].xid = mine[j]->xid;
            s->xids[j].count = mine[j]->count;
        }
        if (rk_field_valid(s, RK_F_XID) && s->xid_count > total)
            continue; /* NVML saw more (and the latest) */
        s->xid_count = total;
        s->last_xid = last;
        rk_field_set(s, RK_F_XID);
    }
}
