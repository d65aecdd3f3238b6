/*
 * The hosts of a multi-host job and the placement of its ranks on them: `rk run --hosts`,
 * `--hostfile` and `--spare-hosts`. Pure parsing and arithmetic with fixed bounds: nothing
 * here allocates but the hostfile reader's buffer, nothing connects or resolves a name (so
 * every parser is fuzzed: fuzz/fuzz_hosts.c).
 *
 * A host name is 1 to 253 bytes of [A-Za-z0-9._-] that does not start with '-' (a DNS name or
 * an IPv4 address: it goes on a launcher's command line, where a leading '-' would be an
 * option), or an IPv6 address in brackets, "[fd00::1]" (no zone "%eth0"). A host is kept as
 * written, an IPv6 address without its brackets and in its canonical form (inet_ntop:
 * "[FD00:0::1]" is kept as "fd00::1"). Two names are the same host when they are equal
 * ignoring case (DNS names are); a job names each host once, its spares included.
 *
 * The host list (--hosts, --spare-hosts): entries separated by ',', each HOST or HOST:N (N
 * slots, that is ranks on the host: digits, 1..RK_HOST_SLOTS_MAX; without ":N", 1 slot), an
 * IPv6 address [ADDR] or [ADDR]:N. No spaces, no empty entries:
 *
 *     gpu-a:4,gpu-b:4,198.18.0.3:2,[fd00::7]:8
 *
 * The hostfile (Open MPI's format, the part of it that says where ranks go): one host a line,
 * its name first, then optional `slots=N` (as above; 1 when absent) and `max_slots=M` (also
 * written `max-slots`; Open MPI's limit on oversubscription, accepted and not used: at least
 * the slots when given). Spaces and tabs separate fields and may stand around '='; '#' starts
 * a comment to the end of its line; blank lines are skipped; a line may end in "\r\n". In the
 * file an IPv6 address may be written with or without brackets. Any other keyword is refused
 * naming the line, and a file without a host is refused:
 *
 *     # the rack
 *     gpu-a slots=4
 *     gpu-b slots=4 max_slots=8   # may take 8
 *     198.18.0.3
 *
 * Errors: a list is RK_EINVAL (a bad command line), a file's text RK_EFORMAT, each with a
 * message that names the entry (or line) and the problem: an empty entry, a slot count that
 * is not a whole number in 1..256, a host named twice (and whether it was a spare), more than
 * RK_HOSTS_MAX hosts, a byte that is not printable ASCII. Such a byte is described ("byte 5
 * is a control character (0x09)"), never quoted; an entry or field is quoted only once it is
 * known to be printable ASCII. On any error the table is left as it was before the call.
 *
 * Placement: the non-spare hosts that are not excluded, in order, each filled up to its
 * slots, then the spare hosts that are not excluded, in order. Rank 0 lands on the first host
 * used, and the ranks of one host are consecutive.
 *
 * Not thread-safe on one table; tables of their own may be used from any thread.
 */
#ifndef RK_CLUSTER_HOSTS_H
#define RK_CLUSTER_HOSTS_H

#include <stddef.h>

#include "rekindle/error.h"

#define RK_HOSTS_MAX 1024         /* hosts of one job, spares included */
#define RK_HOST_NAME_MAX 254      /* a host name or address with its NUL (253 bytes) */
#define RK_HOST_SLOTS_MAX 256     /* ranks on one host */
#define RK_HOSTFILE_MAX (1 << 20) /* bytes of a hostfile read */

typedef struct rk_host {
    char name[RK_HOST_NAME_MAX]; /* as written; an IPv6 address without brackets */
    int slots;                   /* 1..RK_HOST_SLOTS_MAX */
    int spare;                   /* 1: a spare host, used only once the others are full */
} rk_host;

/* The hosts of one job, in the order given: h[0..n). Zero it before the first call. */
typedef struct rk_hosts {
    rk_host h[RK_HOSTS_MAX];
    int n;
} rk_hosts;

/* Append the hosts of a host list ("h1:4,h2:4") to hs, each marked spare (spare != 0) or
 * not. RK_EINVAL with a message otherwise ("host list entry 2 is empty"; a spare list says
 * "spare host list"); hs unchanged then. */
int rk_hosts_parse_list(rk_hosts *hs, const char *list, int spare, rk_err *err);

/* Append the hosts of a hostfile's text (text[0..len), NULs refused) to hs, as non-spare.
 * `what` names the source at the head of every message ("hostfile /x/h": "hostfile /x/h:
 * line 3: unknown keyword 'cpus' (slots=N and max_slots=N are known)"; NULL: "hostfile").
 * RK_EFORMAT otherwise; hs unchanged then. */
int rk_hosts_parse_text(rk_hosts *hs, const char *text, size_t len, const char *what, rk_err *err);

/* Read the hostfile at `path` and append its hosts as rk_hosts_parse_text. The file itself
 * must be a regular file and not a symbolic link (a directory above it may be one); it is
 * opened without blocking (a FIFO does not hang) and checked with fstat before a byte is
 * read: RK_EINVAL for anything else ("hostfile /x/h: is a FIFO, not a regular file"),
 * RK_EFORMAT for more than RK_HOSTFILE_MAX bytes, RK_ENOENT for a missing one, RK_EIO when it
 * cannot be read (base's bounded reader: rekindle/fileio.h). hs unchanged on error. */
int rk_hosts_load_file(rk_hosts *hs, const char *path, rk_err *err);

/* The slots of the hosts not excluded (excluded[i] != 0 excludes host i; NULL: none), the
 * spare hosts counted only when with_spares is not 0. */
int rk_hosts_slots(const rk_hosts *hs, const unsigned char *excluded, int with_spares);

/* Place ranks 0..nranks-1 (nranks >= 1) as the header says: host_of[r] is the index in hs of
 * rank r's host, local_of[r] its index among that host's ranks (0, 1, ...). Returns the
 * number of hosts used, or RK_EINVAL where they do not fit ("6 ranks need 6 slots; the hosts
 * not excluded have 4, spares included") or an argument is wrong; the arrays are not written
 * then. */
int rk_hosts_place(const rk_hosts *hs, const unsigned char *excluded, int nranks, int *host_of,
                   int *local_of, rk_err *err);

/* The hosts as a list ("h1:4,h2:4,[fd00::7]:8"; spares too, unmarked) into buf[cap] for a
 * message; one that does not fit ends in "..." (cap >= 4; 0: buf untouched). Returns buf. */
const char *rk_hosts_describe(const rk_hosts *hs, char *buf, size_t cap);

#endif
