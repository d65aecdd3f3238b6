/*
 * Inside librekindle: a job's secret, the 32-byte key every frame of the node link is
 * authenticated with (HMAC-SHA256, frame.h). The coordinator makes one per job from the
 * kernel's random source, keeps it in a file only its user can read, and hands it to each
 * agent on the agent's stdin, never on a command line (where `ps` would show it).
 *
 * The text form, in the file and on stdin, is 64 hexadecimal characters (upper or lower case;
 * written lower case) and an optional newline, nothing else.
 *
 * A secret file is trusted only if it is a regular file (not a symbolic link: the last
 * component is opened with O_NOFOLLOW), owned by this process's effective uid, with no
 * permission bits for group or others (0600 or stricter), and at most 256 bytes (decided
 * from fstat before a byte is read). Each refusal is RK_EINVAL (RK_ENOENT: missing) with a
 * message naming the path and what is wrong; RK_EFORMAT for content that is not the text
 * form. No message ever quotes the file's content.
 *
 * Wipe every rk_net_secret when done with it (rk_net_secret_wipe: OPENSSL_cleanse, which the
 * compiler cannot drop); the functions here wipe their own copies.
 */
#ifndef RK_NET_SECRET_H
#define RK_NET_SECRET_H

#include <stddef.h>
#include <stdint.h>

#include "net/net.h"

#define RK_NET_SECRET_FILE_MAX 256 /* bytes a secret file may hold */
#define RK_NET_SECRET_HEX_LEN 64   /* characters of the text form, newline not counted */

typedef struct rk_net_secret {
    uint8_t key[RK_NET_SECRET_LEN];
} rk_net_secret;

/* Fill `n` bytes from getrandom(2) (blocks only until the kernel's pool is first ready).
 * RK_EIO if the kernel refuses. */
int rk_net_random(void *buf, size_t n, rk_err *err);

/* A new secret from getrandom(2). */
int rk_net_secret_generate(rk_net_secret *s, rk_err *err);

/* The text form: 64 lower-case hex characters, a newline and a NUL into `out` (66 bytes).
 * Wipe `out` (OPENSSL_cleanse) once it is written where it goes. */
void rk_net_secret_hex(const rk_net_secret *s, char out[RK_NET_SECRET_HEX_LEN + 2]);

/* Parse the text form from `len` bytes (64 hex characters, then at most one '\n'). `label`
 * names the source in messages. RK_EFORMAT otherwise; *s is untouched (and wiped) then. */
int rk_net_secret_parse(rk_net_secret *s, const char *text, size_t len, const char *label,
                        rk_err *err);

/* Write the text form to a new file `path`: created with O_CREAT | O_EXCL | O_NOFOLLOW, mode
 * 0600 (whatever the umask), fsync'ed, and its directory fsync'ed. An existing file (or link)
 * at `path` is never replaced: RK_EINVAL "exists". On failure nothing is left at `path`.
 * Not an atomic rename (base/fileio.h): a temporary file would be 0644 and the rename would
 * replace a file already there; O_EXCL on the path itself is what keeps a secret private. */
int rk_net_secret_write(const rk_net_secret *s, const char *path, rk_err *err);

/* Load a secret file checked as above. On failure *s is wiped. */
int rk_net_secret_load(rk_net_secret *s, const char *path, rk_err *err);

/* Read the text form from `fd` (an agent's stdin: a pipe), one byte at a time so that nothing
 * after the newline is consumed: up to the first '\n' or the end of input, and never more
 * than 65 bytes (the text form's longest). Blocks until then (a non-blocking `fd` is polled).
 * `label` ("stdin") names it in messages. RK_EFORMAT for a bad or missing secret (end of input
 * before 64 characters), RK_EIO if a read fails. */
int rk_net_secret_read_fd(rk_net_secret *s, int fd, const char *label, rk_err *err);

/* Overwrite the key with zeros in a way the compiler keeps (OPENSSL_cleanse). NULL-safe. */
void rk_net_secret_wipe(rk_net_secret *s);

#endif
