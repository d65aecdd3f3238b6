/*
 * A job's secret (net/secret.h): made by getrandom(2), kept as 64 hex characters in a 0600
 * file of this user's or read from an agent's stdin, wiped with OPENSSL_cleanse. Relies on
 * base/fileio.h for the kind of a file in messages and for fsync'ing a directory.
 */
#include "net/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/msg.h"
#include "base/text.h"
#include "rekindle/fileio.h"

int rk_net_random(void *buf, size_t n, rk_err *err)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            char e[128];
            return rk_err_set(err, RK_EIO, "getrandom: %s", rk_msg_strerror(errno, e, sizeof e));
        }
        p += got;
        n -= (size_t)got;
    }
    return RK_OK;
}

int rk_net_secret_generate(rk_net_secret *s, rk_err *err)
{
    int rc = rk_net_random(s->key, sizeof s->key, err);
    if (rc)
        rk_net_secret_wipe(s);
    return rc;
}

void rk_net_secret_wipe(rk_net_secret *s)
{
    if (s)
        OPENSSL_cleanse(s->key, sizeof s->key);
}

void rk_net_secret_hex(const rk_net_secret *s, char out[RK_NET_SECRET_HEX_LEN + 2])
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < RK_NET_SECRET_LEN; i++) {
        out[2 * i] = digits[s->key[i] >> 4];
        out[2 * i + 1] = digits[s->key[i] & 15];
    }
    out[RK_NET_SECRET_HEX_LEN] = '\n';
    out[RK_NET_SECRET_HEX_LEN + 1] = '\0';
}

int rk_net_secret_parse(rk_net_secret *s, const char *text, size_t len, const char *label,
                        rk_err *err)
{
    char shown[256];
    rk_msg_show(shown, sizeof shown, label ? label : "secret");
    size_t n = len;
    if (n > 0 && text[n - 1] == '\n')
        n--;
    if (n != RK_NET_SECRET_HEX_LEN)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: a secret is %d hexadecimal characters and a newline, this holds "
                          "%zu characters",
                          shown, RK_NET_SECRET_HEX_LEN, n);
    rk_net_secret t;
    long bad = rk_hex_decode(text, RK_NET_SECRET_LEN, t.key);
    if (bad >= 0) {
        rk_net_secret_wipe(&t);
        return rk_err_set(err, RK_EFORMAT,
                          "%s: character %ld is not a hexadecimal digit (a secret is %d "
                          "of 0-9a-f and a newline)",
                          shown, bad + 1, RK_NET_SECRET_HEX_LEN);
    }
    *s = t;
    rk_net_secret_wipe(&t);
    return RK_OK;
}

/* The directory part of `path` ("." for a bare name) into dir. */
static void dir_of(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, cap, ".");
    else if (slash == path)
        snprintf(dir, cap, "/");
    else
        snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

int rk_net_secret_write(const rk_net_secret *s, const char *path, rk_err *err)
{
    char shown[256], e[128];
    rk_msg_show(shown, sizeof shown, path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600);
    if (fd < 0) {
        int en = errno;
        if (en == EEXIST)
            return rk_err_set(err, RK_EINVAL,
                              "%s: exists (a secret file is never replaced; remove it or pick "
                              "another path)",
                              shown);
        return rk_err_set(err, en == ENOENT ? RK_ENOENT : rk_err_code_errno(en), "%s: create: %s",
                          shown, rk_msg_strerror(en, e, sizeof e));
    }
    char hex[RK_NET_SECRET_HEX_LEN + 2];
    rk_net_secret_hex(s, hex);
    const char *what = NULL;
    int en = 0;
    if (fchmod(fd, 0600) != 0) /* a umask of 0777 must not leave it unreadable for us */
        what = "chmod", en = errno;
    size_t done = 0;
    while (!what && done < RK_NET_SECRET_HEX_LEN + 1) {
        ssize_t w = write(fd, hex + done, RK_NET_SECRET_HEX_LEN + 1 - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            what = "write", en = w < 0 ? errno : EIO;
        else
            done += (size_t)w;
    }
    OPENSSL_cleanse(hex, sizeof hex);
    if (!what && fsync(fd) != 0)
        what = "fsync", en = errno;
    if (close(fd) != 0 && !what)
        what = "close", en = errno;
    if (what) {
        unlink(path);
        return rk_err_set(err, rk_err_code_errno(en), "%s: %s: %s", shown, what,
                          rk_msg_strerror(en, e, sizeof e));
    }
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    int rc = rk_fsync_dir(dir, err);
    if (rc)
        unlink(path);
    return rc;
}

/* The checks of secret.h on an open file: kind, owner, mode, size. */
static int check_file(int fd, const char *shown, rk_err *err)
{
    struct stat st;
    char e[128];
    if (fstat(fd, &st) != 0)
        return rk_err_set(err, RK_EIO, "%s: fstat: %s", shown, rk_msg_strerror(errno, e, sizeof e));
    if (!S_ISREG(st.st_mode))
        return rk_err_set(err, RK_EINVAL, "%s: is %s, not a regular file", shown,
                          rk_file_kind_name(st.st_mode));
    if (st.st_uid != geteuid())
        return rk_err_set(err, RK_EINVAL,
                          "%s: owned by uid %ld, not by this user (uid %ld): a secret file "
                          "must be the job owner's",
                          shown, (long)st.st_uid, (long)geteuid());
    if (st.st_mode & (S_IRWXG | S_IRWXO))
        return rk_err_set(err, RK_EINVAL,
                          "%s: mode %04o lets group or others %s it; a secret file must be "
                          "0600 (chmod 600 %s)",
                          shown, (unsigned)(st.st_mode & 07777),
                          st.st_mode & (S_IWGRP | S_IWOTH)
                              ? (st.st_mode & (S_IRGRP | S_IROTH) ? "read and write" : "write")
                              : (st.st_mode & (S_IRGRP | S_IROTH) ? "read" : "execute"),
                          shown);
    if (st.st_size > RK_NET_SECRET_FILE_MAX)
        return rk_err_set(err, RK_EINVAL,
                          "%s: %lld bytes, too large for a secret file (at most %d; a secret is "
                          "%d hexadecimal characters and a newline)",
                          shown, (long long)st.st_size, RK_NET_SECRET_FILE_MAX,
                          RK_NET_SECRET_HEX_LEN);
    return RK_OK;
}

int rk_net_secret_load(rk_net_secret *s, const char *path, rk_err *err)
{
    char shown[256], e[128];
    rk_msg_show(shown, sizeof shown, path);
    rk_net_secret_wipe(s);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        int en = errno;
        if (en == ELOOP)
            return rk_err_set(err, RK_EINVAL,
                              "%s: is a symbolic link; a secret file must be a regular file",
                              shown);
        if (en == ENOENT)
            return rk_err_set(err, RK_ENOENT, "%s: no such file", shown);
        return rk_err_set(err, RK_EIO, "%s: open: %s", shown, rk_msg_strerror(en, e, sizeof e));
    }
    int rc = check_file(fd, shown, err);
    char buf[RK_NET_SECRET_FILE_MAX + 1];
    size_t len = 0;
    while (!rc && len < sizeof buf) {
        ssize_t got = read(fd, buf + len, sizeof buf - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            rc =
                rk_err_set(err, RK_EIO, "%s: read: %s", shown, rk_msg_strerror(errno, e, sizeof e));
        else if (got == 0)
            break;
        else
            len += (size_t)got;
    }
    close(fd);
    if (!rc && len > RK_NET_SECRET_FILE_MAX)
        rc = rk_err_set(err, RK_EINVAL, "%s: grew past %d bytes while being read", shown,
                        RK_NET_SECRET_FILE_MAX);
    if (!rc)
        rc = rk_net_secret_parse(s, buf, len, path, err);
    OPENSSL_cleanse(buf, sizeof buf);
    return rc;
}

int rk_net_secret_read_fd(rk_net_secret *s, int fd, const char *label, rk_err *err)
{
    char shown[256], e[128];
    rk_msg_show(shown, sizeof shown, label ? label : "stdin");
    rk_net_secret_wipe(s);
    char buf[RK_NET_SECRET_HEX_LEN + 1];
    size_t len = 0;
    int rc = RK_OK;
    while (len < sizeof buf) {
        ssize_t got = read(fd, buf + len, 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) { /* a non-blocking stdin */
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, -1) >= 0 || errno == EINTR)
                continue;
        }
        if (got < 0) {
            rc =
                rk_err_set(err, RK_EIO, "%s: read: %s", shown, rk_msg_strerror(errno, e, sizeof e));
            break;
        }
        if (got == 0)
            break;
        if (buf[len++] == '\n')
            break;
    }
    if (!rc && len == 0)
        rc = rk_err_set(err, RK_EFORMAT, "%s: ended before a secret was read", shown);
    if (!rc)
        rc = rk_net_secret_parse(s, buf, len, shown, err);
    OPENSSL_cleanse(buf, sizeof buf);
    return rc;
}
