/*
 * Inside librekindle: Xids since boot from the kernel log (docs/health.md, "Past Xids"). The
 * NVIDIA driver logs every Xid as a kernel message,
 *
 *     NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
 *
 * and NVML only tells of the ones that happen while it is watching, so the health layer reads
 * the log too and counts, per GPU bus id and per Xid code, every such line since boot.
 *
 * Sources, tried in this order at the first read (the choice is kept):
 *   RK_KMSG_PATH  (not privileged: base/env.h) a regular file of /dev/kmsg records, one a
 *                 line, for tests; re-read whole at every read, at most RK_KMSG_FILE_MAX bytes
 *   /dev/kmsg     the kernel's record device (a character device), kept open: the first read
 *                 starts at the oldest record still in the ring, later ones take what is new
 *   journalctl    `journalctl -k -b -o export` when /dev/kmsg cannot be opened (not
 *                 privileged, dmesg_restrict): run with an argv, output bounded
 *                 (RK_KMSG_JOURNAL_MAX), within RK_KMSG_JOURNAL_WAIT_S; later runs continue
 *                 with --after-cursor from the last entry read
 * When none works the reader says why (rk_kmsg_note) and counts nothing.
 *
 * Rules. Only kernel-facility records count (facility 0, PRI >> 3 == 0; journal entries with
 * SYSLOG_FACILITY=0): a user writing to /dev/kmsg gets facility 1 and is never counted. A
 * record is counted once: the reader keeps the highest sequence number it has seen and skips
 * records at or below it (the file and a reopened device are read from the start again); the
 * journal continues after its last cursor. Bus ids are normalised to NVML's form,
 * "%08x:%02x:%02x.%x" (domain, bus, device, function), so that they match rk_gpu_info.bus_id.
 * Bounded: a line or record of more than RK_KMSG_LINE_MAX bytes, RK_KMSG_RECORDS_MAX records
 * per read (the rest is taken by the next read), RK_KMSG_PAIRS_MAX (bus id, code) pairs (more
 * are counted in rk_kmsg_dropped, not kept).
 *
 * Not thread-safe: one caller reads and merges.
 */
#ifndef RK_HEALTH_KMSG_H
#define RK_HEALTH_KMSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"
#include "rekindle/health.h"

#define RK_KMSG_ENV "RK_KMSG_PATH"
#define RK_KMSG_DEVICE "/dev/kmsg"
#define RK_KMSG_LINE_MAX 8192                 /* longest record (or journal field) read */
#define RK_KMSG_RECORDS_MAX 100000            /* records taken per read */
#define RK_KMSG_FILE_MAX ((size_t)16 << 20)   /* largest RK_KMSG_PATH file */
#define RK_KMSG_JOURNAL_MAX ((size_t)8 << 20) /* journalctl output read per run */
#define RK_KMSG_JOURNAL_WAIT_S 10.0
#define RK_KMSG_PAIRS_MAX 512 /* distinct (bus id, Xid code) pairs kept */
#define RK_KMSG_XID_MAX 65535 /* the largest Xid code accepted */

/* One /dev/kmsg record's header line, "PRI,SEQ,TS_USEC,FLAGS[,...];MESSAGE". */
typedef struct rk_kmsg_record {
    int facility, level; /* PRI >> 3, PRI & 7 */
    uint64_t seq, ts_usec;
    const char *msg; /* into the parsed text, not NUL-ended */
    size_t msg_len;
} rk_kmsg_record;

/* Parse one header line (without its '\n'). 0 when it is one; -1 otherwise. */
int rk_kmsg_parse_record(const char *line, size_t len, rk_kmsg_record *out);

/* An NVRM Xid message ("NVRM: Xid (PCI:<bus id>): <code>, ..."): 1 with the normalised bus id
 * in bus_id[cap] (cap >= 17) and the code in *xid; 0 when the message is not one. */
int rk_kmsg_parse_xid(const char *msg, size_t len, char *bus_id, size_t cap, int *xid);

/* A PCI bus id "[domain:]bus:device[.function]" (hex) normalised to "%08x:%02x:%02x.%x" in
 * out[cap] (cap >= 17): 0, or -1 when it is not one (a part out of range, other characters). */
int rk_kmsg_bus_id_norm(const char *s, size_t len, char *out, size_t cap);

typedef struct rk_kmsg rk_kmsg;

int rk_kmsg_create(rk_kmsg **out, rk_err *err);
void rk_kmsg_free(rk_kmsg *k); /* NULL-safe; closes the device */

/* Count the Xids of `len` bytes of /dev/kmsg records, one a line, continuation lines
 * (" KEY=VALUE") after their record, blank lines skipped. A line that is not a record, too
 * long, a NUL byte or a continuation line first is RK_EFORMAT naming `label`, the line and
 * the problem; nothing of that text is counted then. */
int rk_kmsg_feed(rk_kmsg *k, const char *label, const char *text, size_t len, rk_err *err);

/* Count the Xids of `journalctl -o export` output: entries of fields "NAME=value\n" or
 * "NAME\n" + 64-bit little-endian size + bytes + "\n", each entry ended by an empty line.
 * `complete` false: the text was cut (bounded output), so an unfinished last entry is left
 * for the next run; true: it is RK_EFORMAT. The last entry's __CURSOR is kept for
 * rk_kmsg_read's next run. Errors as rk_kmsg_feed. */
int rk_kmsg_feed_export(rk_kmsg *k, const char *label, const char *text, size_t len, bool complete,
                        rk_err *err);

/* Read what is new from the source (chosen at the first call, as the header says). RK_OK also
 * when no source can be read (rk_kmsg_note says why); RK_EFORMAT or RK_EINVAL for an
 * RK_KMSG_PATH file that is bad (not regular, too large, not records), RK_ENOMEM. */
int rk_kmsg_read(rk_kmsg *k, rk_err *err);

/* One run of journalctl (`journalctl` as PATH finds it) as rk_kmsg_read's fallback does it:
 * the whole log since boot the first time, after the last cursor later. RK_OK; RK_EIO when it
 * could not run, failed or timed out; RK_EFORMAT for output that is not the export format;
 * RK_ENOMEM. Exposed for tests (a fake journalctl in PATH). */
int rk_kmsg_read_journal(rk_kmsg *k, rk_err *err);

/* The source read ("/dev/kmsg", "journalctl", the RK_KMSG_PATH file), or NULL when none
 * could be (before the first read too). */
const char *rk_kmsg_source(const rk_kmsg *k);
/* Why no source could be read ("" when one was). */
const char *rk_kmsg_note(const rk_kmsg *k);

/* The count of Xid `xid` on bus id `bus_id` (any form rk_kmsg_bus_id_norm takes) so far. */
uint64_t rk_kmsg_count(const rk_kmsg *k, const char *bus_id, int xid);
/* (bus id, code) pairs that did not fit RK_KMSG_PAIRS_MAX: their events not counted. */
uint64_t rk_kmsg_dropped(const rk_kmsg *k);

/* Merge the counts into samples[n] by bus id, when a source was read: per GPU (not lost,
 * with a bus id) xids[] gets the counts of its codes (the most frequent first, ties by code),
 * xid_count the larger of NVML's count and the log's total, last_xid the latest code (NVML's
 * when NVML counted more), and RK_F_XID is set (a log read without this GPU's Xids says 0). */
void rk_kmsg_merge(const rk_kmsg *k, const rk_gpu_info *infos, rk_gpu_sample *samples, int n);

/* The kernel log source an NVML telemetry merges (rk_telemetry_read_all), NULL before its
 * first read, for other backends, or when none could be read (then *note, when note is not
 * NULL, says why; "" otherwise). For rk doctor's JSON. */
const char *rk_telemetry_kmsg_source(const rk_telemetry *t, const char **note);

#endif
