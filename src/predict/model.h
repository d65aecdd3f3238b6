/*
 * Inside the predictor (predict/predict.h): the model's parameter block, the work space of a
 * mini-batch, and the forward and backward passes. Exposed to the unit tests, which check
 * every gradient against finite differences; nothing outside src/predict and tests uses it.
 *
 * Layout of a batch of B windows in the work space: time-major, [T][B][...], so that one
 * step of the whole batch is one contiguous matrix and the input projection and the weight
 * gradients of the LSTM are single GEMMs over all T*B rows.
 */
#ifndef RK_PREDICT_MODEL_H
#define RK_PREDICT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "predict/predict.h"

/* The trainable tensors, in the order of the parameter block (and of the saved file). */
enum {
    RK_PT_WX, /* [F, 4H] */
    RK_PT_WH, /* [H, 4H] */
    RK_PT_B,  /* [4H] */
    RK_PT_WA, /* [H, A] */
    RK_PT_BA, /* [A] */
    RK_PT_VA, /* [A] */
    RK_PT_W1, /* [2H, D] */
    RK_PT_B1, /* [D] */
    RK_PT_W2, /* [D] */
    RK_PT_B2, /* [1] */
    RK_PT_COUNT
};

typedef struct rk_pred_tensor {
    const char *name; /* as saved: "lstm.wx" */
    size_t offset;    /* into the parameter block, in floats */
    size_t numel;
    int ndim;
    int64_t shape[2];
} rk_pred_tensor;

struct rk_pred_model {
    rk_pred_config c;
    rk_pred_tensor t[RK_PT_COUNT];
    float *p; /* every parameter, one block */
    size_t np;
    float *mean;         /* [F] */
    float *std;          /* [F] */
    float y_mean, y_std; /* regression target (0 and 1 for classification) */
};

/* The work space of one mini-batch of at most bmax windows. */
typedef struct rk_pred_ws {
    int bmax, b;
    float *xn;    /* [T][B][F]  normalised inputs */
    float *gate;  /* [T][B][4H] activated gates i f g o */
    float *h;     /* [T+1][B][H] h_0 = 0 */
    float *c;     /* [T+1][B][H] c_0 = 0 */
    float *tc;    /* [T][B][H]  tanh(c_t) */
    float *s;     /* [T][B][A]  tanh(h_t Wa + ba) */
    float *alpha; /* [T][B] */
    float *z;     /* [B][2H]    ctx, h_T */
    float *u;     /* [B][D] */
    float *out;   /* [B]        the raw output (logit or standardised value) */
    float *mask;  /* [B][2H]    dropout on z: 0 or 1/(1-p) per element; NULL: none (inference;
                     rk_pred_train points it at its own buffer while training) */
    /* backward only (NULL when the work space was made for inference) */
    float *dgate;     /* [T][B][4H] */
    float *dh;        /* [T][B][H] gradient reaching h_t from above (attention, head) */
    float *ds;        /* [T][B][A] */
    float *dz;        /* [B][2H] */
    float *du;        /* [B][D] */
    float *dhr, *dcr; /* [B][H] recurrent gradients */
    float *tmp;       /* [T][B] */
} rk_pred_ws;

int rk_pred_ws_init(rk_pred_ws *w, const rk_pred_config *c, int bmax, int backward, rk_err *err);
void rk_pred_ws_free(rk_pred_ws *w);

/* Normalise b windows into the work space: window k of the batch is x + idx[k] * T * F (idx
 * NULL: k). */
void rk_pred_gather(const rk_pred_model *m, rk_pred_ws *w, const float *x, const uint32_t *idx,
                    int b);
/* The forward pass of the gathered batch; fills w->out. */
void rk_pred_forward(const rk_pred_model *m, rk_pred_ws *w);
/* The batch's loss (mean over the batch; the target y[k] is standardised here for regression)
 * and, when grad is not NULL, its gradient with respect to every parameter into grad (np
 * floats, overwritten). Call after rk_pred_forward. */
double rk_pred_backward(const rk_pred_model *m, rk_pred_ws *w, const float *y, float pos_weight,
                        float *grad);

/* The loss of one window's raw output against a raw target y (for regression y is
 * standardised with the model's statistics), and its derivative with respect to out. */
double rk_pred_unit_loss(const rk_pred_model *m, float out, float y, float pos_weight,
                         double *dout);

#endif
