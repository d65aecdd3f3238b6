/*
 * Frames of the node link (net/frame.h): the 48-byte header in little-endian (base/bytes.h),
 * and the HMAC-SHA256 tag over header and payload from OpenSSL's libcrypto, compared in
 * constant time. The layout is docs/cluster-protocol.md's table; keep the two together.
 */
#include "net/frame.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>

#include "base/bytes.h"
#include "base/msg.h"

/* Byte offsets in the header. */
enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_TYPE = 5,
    OFF_FLAGS = 6,
    OFF_RESERVED = 7,
    OFF_SENDER = 8,
    OFF_RECEIVER = 12,
    OFF_GENERATION = 16,
    OFF_LEN = 20,
    OFF_SEQ = 24,
    OFF_JOB = 32
};
_Static_assert(OFF_JOB + RK_NET_JOB_ID_LEN == RK_NET_HDR_LEN, "header layout");

const char *rk_net_strerror(int code)
{
    switch (code) {
    case RK_NET_EAUTH: return "wrong secret or tampered frame";
    case RK_NET_EREPLAY: return "replayed or reordered frame";
    case RK_NET_EFENCED: return "frame of another launch (fenced)";
    case RK_NET_EJOB: return "frame of another job";
    case RK_NET_EPEER: return "frame from or for another node";
    case RK_NET_ETOOBIG: return "frame too large";
    case RK_NET_ECLOSED: return "connection closed";
    default: return rk_strerror(code);
    }
}

static const char *who(const char *from)
{
    return from && *from ? from : "peer";
}

/* The tag of `n` bytes at `data` into tag[RK_NET_TAG_LEN]. */
static int mac(const rk_net_secret *key, const uint8_t *data, size_t n, uint8_t *tag, rk_err *err)
{
    unsigned tag_len = 0;
    if (!HMAC(EVP_sha256(), key->key, (int)sizeof key->key, data, n, tag, &tag_len) ||
        tag_len != RK_NET_TAG_LEN)
        return rk_err_set(err, RK_EBACKEND, "HMAC-SHA256 failed in libcrypto");
    return RK_OK;
}

int rk_net_frame_seal(const rk_net_secret *key, const rk_net_hdr *h, const void *payload,
                      uint8_t *out, size_t cap, size_t *out_len, rk_err *err)
{
    if (h->len > RK_NET_PAYLOAD_MAX)
        return rk_err_set(err, RK_NET_ETOOBIG, "frame to seal: payload of %u bytes, more than %u",
                          (unsigned)h->len, RK_NET_PAYLOAD_MAX);
    size_t total = rk_net_frame_size(h->len);
    if (cap < total)
        return rk_err_set(err, RK_EINVAL, "frame to seal: %zu bytes do not fit a buffer of %zu",
                          total, cap);
    memcpy(out + OFF_MAGIC, RK_NET_MAGIC, 4);
    out[OFF_VERSION] = RK_NET_VERSION;
    out[OFF_TYPE] = h->type;
    out[OFF_FLAGS] = h->flags;
    out[OFF_RESERVED] = 0;
    rk_le32_store(out + OFF_SENDER, h->sender);
    rk_le32_store(out + OFF_RECEIVER, h->receiver);
    rk_le32_store(out + OFF_GENERATION, h->generation);
    rk_le32_store(out + OFF_LEN, h->len);
    rk_le64_store(out + OFF_SEQ, h->seq);
    memcpy(out + OFF_JOB, h->job, RK_NET_JOB_ID_LEN);
    if (h->len)
        memmove(out + RK_NET_HDR_LEN, payload, h->len);
    int rc = mac(key, out, RK_NET_HDR_LEN + h->len, out + RK_NET_HDR_LEN + h->len, err);
    if (rc)
        return rc;
    if (out_len)
        *out_len = total;
    return RK_OK;
}

int rk_net_frame_peek(const uint8_t *buf, size_t avail, const char *from, size_t *total,
                      rk_err *err)
{
    *total = 0;
    if (avail == 0)
        return RK_OK;
    char shown[RK_NET_ADDR_MAX + 16];
    rk_msg_show(shown, sizeof shown, who(from));
    size_t m = avail < 4 ? avail : 4;
    if (memcmp(buf, RK_NET_MAGIC, m) != 0)
        return rk_err_set(err, RK_EFORMAT, "garbage from %s: not a node-link frame (bad magic)",
                          shown);
    if (avail > OFF_VERSION && buf[OFF_VERSION] != RK_NET_VERSION)
        return rk_err_set(err, RK_EFORMAT,
                          "frame from %s: protocol version %u, this rekindle speaks version %u",
                          shown, buf[OFF_VERSION], RK_NET_VERSION);
    if (avail > OFF_RESERVED && buf[OFF_RESERVED] != 0)
        return rk_err_set(err, RK_EFORMAT, "frame from %s: reserved header byte is %u, not 0",
                          shown, buf[OFF_RESERVED]);
    if (avail >= OFF_LEN + 4) {
        uint32_t len = rk_le32_load(buf + OFF_LEN);
        if (len > RK_NET_PAYLOAD_MAX)
            return rk_err_set(err, RK_NET_ETOOBIG,
                              "frame from %s: payload of %u bytes, more than %u", shown,
                              (unsigned)len, RK_NET_PAYLOAD_MAX);
        if (avail >= RK_NET_HDR_LEN)
            *total = rk_net_frame_size(len);
    }
    return RK_OK;
}

int rk_net_frame_open(const rk_net_secret *key, const uint8_t *buf, size_t len, const char *from,
                      rk_net_hdr *h, const uint8_t **payload, rk_err *err)
{
    memset(h, 0, sizeof *h);
    *payload = NULL;
    char shown[RK_NET_ADDR_MAX + 16];
    rk_msg_show(shown, sizeof shown, who(from));
    size_t total;
    int rc = rk_net_frame_peek(buf, len, from, &total, err);
    if (rc)
        return rc;
    if (total == 0)
        return rk_err_set(err, RK_EFORMAT,
                          "frame from %s: truncated: %zu bytes, less than a %d-byte header", shown,
                          len, RK_NET_HDR_LEN);
    if (len != total)
        return rk_err_set(err, RK_EFORMAT, "frame from %s: %s: %zu bytes, the header says %zu",
                          shown, len < total ? "truncated" : "trailing bytes", len, total);
    uint32_t plen = rk_le32_load(buf + OFF_LEN);
    uint8_t tag[RK_NET_TAG_LEN];
    rc = mac(key, buf, RK_NET_HDR_LEN + plen, tag, err);
    if (rc)
        return rc;
    if (CRYPTO_memcmp(tag, buf + RK_NET_HDR_LEN + plen, RK_NET_TAG_LEN) != 0)
        return rk_err_set(err, RK_NET_EAUTH, "wrong secret or tampered frame from %s", shown);
    h->type = buf[OFF_TYPE];
    h->flags = buf[OFF_FLAGS];
    h->sender = rk_le32_load(buf + OFF_SENDER);
    h->receiver = rk_le32_load(buf + OFF_RECEIVER);
    h->generation = rk_le32_load(buf + OFF_GENERATION);
    h->len = plen;
    h->seq = rk_le64_load(buf + OFF_SEQ);
    memcpy(h->job, buf + OFF_JOB, RK_NET_JOB_ID_LEN);
    *payload = buf + RK_NET_HDR_LEN;
    return RK_OK;
}
