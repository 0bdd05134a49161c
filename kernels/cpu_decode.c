/* A Llama forward on x86 CPUs with AVX2, FMA and F16C — prompts and decode steps, any mix of cache slots and
 * positions in one call — reading 4-bit (and 8-bit) block weights once per call. Built on first use by
 * kernels/cpu_decode.py (cc -O3 -mavx2 -mfma -mf16c -fopenmp) and called through ctypes.
 *
 * Weights are repacked for the kernel (cpu_decode.Packed): rows in groups of 8; for each group and each block
 * of 32 inputs, the 8 rows' quantized values side by side (4-bit: rows in the order 0 4 1 5 2 6 3 7, see
 * group_dot4), then their fp16 scales (and, for 4-bit, their fp16 offsets) in row order: w = d * (q - 8) + z,
 * q in 0..15 (llama.cpp's Q4_1 with z = m + 8 d; Q4_0 is z = 0), or w = d * q, q in -127..127 (Q8_0).
 *
 * Activations are float32. Each matmul quantizes its input per block of 32 to int8 with a float scale (as
 * llama.cpp's q8 activations and ONNX Runtime's MatMulNBits at accuracy level 4 do), or, for prompts, to two
 * int8 terms (`fine`: the value and what it leaves, ~14 bits); the offsets' term uses each block's exact float
 * sum. The 4-bit dot products are centred (q - 8, not q: the inputs' rounding errors meet weights a third the
 * size, MatMulNBits' error rather than 3x it). A group-block is a 32-wide int8 dot product for each of 8 rows
 * (vpmaddubsw + vpmaddwd), reduced to one vector of 8 row sums and scaled by 8 scales at once.
 *
 * The KV cache is the caller's (fp16 [layers, slots, Hkv, S, D], any strides): each call writes the position
 * of each of its rows in that row's slot and attends over the slot's positions 0..pos.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *data; /* packed groups, see above */
    int64_t n, k;        /* logical output rows and inputs (k % 32 == 0) */
    int64_t bits;        /* 4 or 8 */
} srt_mat;

typedef struct {
    const float *attn_norm, *ffn_norm; /* [dim] */
    srt_mat qkv, o, gate_up, down;     /* fused q|k|v, o, gate|up, down */
    const float *qkv_bias;             /* [(n_heads + 2 n_kv) * head_dim], or NULL (Qwen2 has them) */
    const float *q_norm, *k_norm;      /* [head_dim] RMSNorm over each q / k head, or NULL (Qwen3 has them) */
    /* Gemma 3: RMSNorms of the attention's and the MLP's outputs before their residual adds, or NULL; the layer's
     * rotary tables (NULL: the model's); a sliding window (attends over the last `window` positions; 0: all) */
    const float *post_attn_norm, *post_ffn_norm;
    const float *cos, *sin;
    int64_t window;
} srt_layer;

typedef struct {
    int64_t dim, n_layers, n_heads, n_kv, head_dim, hidden, vocab, max_pos;
    float eps;
    const float *emb;       /* [vocab, dim] */
    const float *norm;      /* [dim] */
    const float *cos, *sin; /* [max_pos, head_dim / 2] */
    const srt_layer *layers;
    srt_mat head;
    int64_t act; /* the MLP's gate: 0 SiLU (SwiGLU), 1 GELU with the tanh approximation (GeGLU: Gemma) */
} srt_model;

/* ---- activations: per block of 32, int8 values, their scale and the exact block sum ---- */

typedef struct {
    int8_t *q;    /* [M, K] */
    float *d, *s; /* [M, K / 32]: scale, exact float sum */
    int32_t *is;  /* [M, K / 32]: sum of the int8 values */
} qact;

/* room for n int8 values (n / 32 blocks); ok is 0 where an allocation failed */
static qact qact_new(int64_t n, int *ok) {
    qact a = {malloc(n), malloc(n / 32 * sizeof(float)), malloc(n / 32 * sizeof(float)),
              malloc(n / 32 * sizeof(int32_t))};
    *ok = a.q && a.d && a.s && a.is;
    return a;
}

static void qact_free(qact *a) { free(a->q), free(a->d), free(a->s), free(a->is); }

/* block i (32 values at p) into a */
static void quantize_block(const float *p, qact *a, int64_t i) {
    float amax = 0.f, sum = 0.f;
    int nan = 0;
    for (int j = 0; j < 32; j++) {
        float v = fabsf(p[j]);
        amax = v > amax ? v : amax;
        nan |= v != v;
        sum += p[j];
    }
    /* a NaN (or inf) input makes its block's scale NaN, so it reaches the output as a NaN */
    const int bad = nan || isinf(amax);
    float inv = amax > 0.f && !bad ? 127.f / amax : 0.f;
    int32_t isum = 0;
    for (int j = 0; j < 32; j++) isum += a->q[i * 32 + j] = (int8_t)nearbyintf(p[j] * inv);
    a->is[i] = isum;
    a->d[i] = bad ? NAN : amax / 127.f;
    a->s[i] = sum;
}

/* block i of p as above, and what that leaves (p minus its int8 values times their scale) as block i2: two
 * int8 terms whose sum is p to ~1/127^2 of a block's largest value. The remainder's offset term is 0 (block i
 * has the exact sum). */
static void quantize_fine(const float *p, qact *a, int64_t i, int64_t i2) {
    float r[32];
    quantize_block(p, a, i);
    for (int j = 0; j < 32; j++) r[j] = p[j] - a->d[i] * (float)a->q[i * 32 + j];
    quantize_block(r, a, i2);
    a->s[i2] = 0.f;
}

/* x [M, K] -> M rows of int8 blocks, or with `fine` 2M rows: the values, then the remainders (quantize_fine) */
static void quantize_rows(const float *x, int64_t M, int64_t K, qact *a, int fine) {
    const int64_t n = M * K / 32;
    for (int64_t i = 0; i < n; i++) {
        if (fine)
            quantize_fine(x + i * 32, a, i, n + i);
        else
            quantize_block(x + i * 32, a, i);
    }
}

/* e^x for 8 floats (Cephes' polynomial, as in avx_mathfun; ~1 ulp), x clamped to [-88.38, 88.38] */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-88.3762626647949f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
    const __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

static inline float hsum_ps(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_hadd_ps(a, a);
    return _mm_cvtss_f32(_mm_hadd_ps(a, a));
}

#define MAXD 256 /* head_dim the attention takes (a multiple of 8) */

static inline __m256 load_h8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

#define MAXPER 16 /* query heads per kv head the attention takes */
#define PART 64    /* positions per part of a row's attention (attend_part) */

/* The `per` query heads of one kv head (q: per x D, contiguous) over the cached positions [t0, t1) (fp16 keys and
 * values `ps` apart): each head's unnormalized output o [per, D], the max of its scores and the sum of their
 * exponentials (a split of flash decoding, merged by merge_parts). Each key is read and converted once for
 * all the group's heads; p: per x (t1 - t0) floats of scratch; head h's results at o + h hs D, mx + h hs and
 * sum + h hs. */
static void attend_part(const float *q, int64_t per, const uint16_t *kb, const uint16_t *vb, int64_t ps, int64_t t0,
                        int64_t t1, int64_t D, float scale, float *p, float *o, float *mx, float *sum, int64_t hs) {
    const int64_t nv = D / 8, T = t1 - t0;
    float qs[MAXPER * MAXD];
    for (int64_t i = 0; i < per * D; i++) qs[i] = q[i] * scale;
    float m[MAXPER];
    for (int64_t h = 0; h < per; h++) m[h] = -INFINITY;
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *kt = kb + (t0 + t) * ps;
        _mm_prefetch((const char *)(kt + 8 * ps), _MM_HINT_T0);
        _mm_prefetch((const char *)(kt + 8 * ps + 32), _MM_HINT_T0);
        __m256 kv[MAXD / 8];
        for (int64_t i = 0; i < nv; i++) kv[i] = load_h8(kt + 8 * i);
        for (int64_t h = 0; h < per; h++) {
            const float *qh = qs + h * D;
            __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qh), kv[0]);
            for (int64_t i = 1; i < nv; i++) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * i), kv[i], acc);
            const float sc = p[h * T + t] = hsum_ps(acc);
            m[h] = sc > m[h] ? sc : m[h];
        }
    }
    for (int64_t h = 0; h < per; h++) {
        float *ph = p + h * T;
        __m256 tot = _mm256_setzero_ps();
        int64_t t = 0;
        for (; t + 8 <= T; t += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(ph + t), _mm256_set1_ps(m[h])));
            _mm256_storeu_ps(ph + t, e);
            tot = _mm256_add_ps(tot, e);
        }
        float tsum = hsum_ps(tot);
        for (; t < T; t++) tsum += ph[t] = expf(ph[t] - m[h]);
        mx[h * hs] = m[h];
        sum[h * hs] = tsum;
        __m256 ov[MAXD / 8];
        for (int64_t i = 0; i < nv; i++) ov[i] = _mm256_setzero_ps();
        for (t = 0; t < T; t++) {
            const uint16_t *vt = vb + (t0 + t) * ps;
            if (h == 0) {
                _mm_prefetch((const char *)(vt + 8 * ps), _MM_HINT_T0);
                _mm_prefetch((const char *)(vt + 8 * ps + 32), _MM_HINT_T0);
            }
            const __m256 w = _mm256_set1_ps(ph[t]);
            for (int64_t i = 0; i < nv; i++) ov[i] = _mm256_fmadd_ps(w, load_h8(vt + 8 * i), ov[i]);
        }
        for (int64_t i = 0; i < nv; i++) _mm256_storeu_ps(o + h * hs * D + 8 * i, ov[i]);
    }
}

/* C parts of one head (o [C, D] unnormalized, their max and sum; a part with sum 0 is empty) -> out [D] */
static void merge_parts(const float *o, const float *mx, const float *sum, int64_t C, int64_t D, float *out) {
    float m = -INFINITY, tot = 0.f;
    for (int64_t c = 0; c < C; c++)
        if (sum[c] > 0.f && mx[c] > m) m = mx[c];
    for (int64_t i = 0; i < D; i++) out[i] = 0.f;
    for (int64_t c = 0; c < C; c++) {
        if (!(sum[c] > 0.f)) continue;
        const float w = expf(mx[c] - m);
        tot += w * sum[c];
        for (int64_t i = 0; i < D; i++) out[i] += w * o[c * D + i];
    }
    const float inv = 1.f / tot;
    for (int64_t i = 0; i < D; i++) out[i] *= inv;
}

/* int8 dot products of 32-byte vectors, 4 bytes to each of 8 int32 lanes: u (unsigned, at most 127) times s
 * (signed), plus a second pair for the 4-bit rows. With VNNI (SRT_VNNI: AVX512-VNNI + AVX512-VL, or AVX-VNNI)
 * one vpdpbusd a pair; without, vpmaddubsw + vpmaddwd. The sums are the same integers either way: no 16-bit
 * pair sum here saturates (4-bit: 2 x 15 x 127 twice = 7620; 8-bit: 2 x 127 x 127). */
#if defined(SRT_VNNI) && defined(__AVXVNNI__)
#define SRT_DPBUSD _mm256_dpbusd_avx_epi32
#elif defined(SRT_VNNI)
#define SRT_DPBUSD _mm256_dpbusd_epi32
#endif
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#ifdef SRT_DPBUSD
    return SRT_DPBUSD(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
static inline __m256i dot2_u8s8(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
#ifdef SRT_DPBUSD
    return SRT_DPBUSD(SRT_DPBUSD(_mm256_setzero_si256(), u0, s0), u1, s1);
#else
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1)),
                             _mm256_set1_epi16(1));
#endif
}

/* eight vectors of eight int32 -> one vector of their eight sums */
static inline __m256i hsum8(const __m256i *p) {
    __m256i s01 = _mm256_hadd_epi32(p[0], p[1]), s23 = _mm256_hadd_epi32(p[2], p[3]);
    __m256i s45 = _mm256_hadd_epi32(p[4], p[5]), s67 = _mm256_hadd_epi32(p[6], p[7]);
    __m256i a = _mm256_hadd_epi32(s01, s23), b = _mm256_hadd_epi32(s45, s67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

#define MAXM 64 /* activation rows one call takes (a decode step's batch) */

/* 4-bit: y[m, n] = sum_k w[n, k] x[m, k] for the 8 rows of group g, all M activation rows. A group-block is
 * four 32-byte loads, each two rows (r and r + 4) side by side: the low nibbles meet x[0:16] and the high
 * ones x[16:32] broadcast to both halves, and three horizontal adds leave the 8 rows' sums in order. */
static inline __attribute__((always_inline)) void group_dot4(const srt_mat *w, int64_t g, const qact *a, int64_t M,
                                                             __m256 *acc) {
    const int64_t nb = w->k / 32;
    const uint8_t *base = w->data + g * nb * 160;
    const __m256i low = _mm256_set1_epi8(0xF);
    for (int64_t m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = base + b * 160;
        /* six group-blocks ahead (measured best of 3, 6, 12 on Zen 3: ~10 % off a step) */
        _mm_prefetch((const char *)(blk + 160 * 6), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + 160 * 6 + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + 160 * 6 + 128), _MM_HINT_T0);
        __m256i lo[4], hi[4];
        for (int r = 0; r < 4; r++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 32 * r));
            lo[r] = _mm256_and_si256(q, low);
            hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 128)));
        const __m256 z = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 144)));
        for (int64_t m = 0; m < M; m++) {
            const int8_t *xq = a->q + (m * nb + b) * 32;
            const __m256i xl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xq));
            const __m256i xh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xq + 16)));
            __m256i p[4];
            for (int r = 0; r < 4; r++) p[r] = dot2_u8s8(lo[r], xl, hi[r], xh);
            __m256i si = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            si = _mm256_sub_epi32(si, _mm256_set1_epi32(8 * a->is[m * nb + b])); /* centred: q - 8 */
            const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(a->d[m * nb + b]));
            acc[m] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(si), acc[m]);
            acc[m] = _mm256_fmadd_ps(z, _mm256_set1_ps(a->s[m * nb + b]), acc[m]);
        }
    }
}

/* 8-bit: as group_dot4, one 32-byte load per row (signed x signed: |w| times x with w's sign) */
static inline __attribute__((always_inline)) void group_dot8(const srt_mat *w, int64_t g, const qact *a, int64_t M,
                                                             __m256 *acc) {
    const int64_t nb = w->k / 32;
    const uint8_t *base = w->data + g * nb * 272;
    for (int64_t m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = base + b * 272;
        for (int c = 0; c < 272; c += 64) _mm_prefetch((const char *)(blk + 272 * 4 + c), _MM_HINT_T0);
        __m256i wv[8], aw[8];
        for (int r = 0; r < 8; r++) {
            wv[r] = _mm256_loadu_si256((const __m256i *)(blk + 32 * r));
            aw[r] = _mm256_sign_epi8(wv[r], wv[r]);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 256)));
        for (int64_t m = 0; m < M; m++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(a->q + (m * nb + b) * 32));
            __m256i p[8];
            for (int r = 0; r < 8; r++)
                p[r] = dot_u8s8(aw[r], _mm256_sign_epi8(xv, wv[r]));
            const __m256 s = _mm256_cvtepi32_ps(hsum8(p));
            acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(a->d[m * nb + b])), s, acc[m]);
        }
    }
}

static void matmul(const srt_mat *w, const qact *a, int64_t M, float *y, int64_t ldy) {
    const int64_t groups = (w->n + 7) / 8;
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        __m256 acc[MAXM];
        if (w->bits == 4 && M == 1) /* one row (a decode step of one sequence): its accumulator in a register */
            group_dot4(w, g, a, 1, acc);
        else if (w->bits == 4)
            group_dot4(w, g, a, M, acc);
        else if (M == 1)
            group_dot8(w, g, a, 1, acc);
        else
            group_dot8(w, g, a, M, acc);
        for (int64_t m = 0; m < M; m++) {
            float tmp[8];
            _mm256_storeu_ps(tmp, acc[m]);
            int64_t rows = w->n - g * 8 < 8 ? w->n - g * 8 : 8;
            memcpy(y + m * ldy + g * 8, tmp, rows * sizeof(float));
        }
    }
}

/* y [M, ldy] = w x for M rows of activations, quantized fine (2M rows: values and remainders, summed here;
 * y holds 2M rows) or not */
static void matmul_rows(const srt_mat *w, const qact *a, int64_t M, int fine, float *y, int64_t ldy) {
    matmul(w, a, fine ? 2 * M : M, y, ldy);
    if (fine) {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < M * ldy; i++) y[i] += y[M * ldy + i];
    }
}

/* Standalone matmul (tests, benchmarks): x [M, K] float32 -> y [M, N], x quantized `fine` or not. */
int srt_matmul(const srt_mat *w, const float *x, int64_t M, float *y, int fine, int nthreads) {
    const int64_t R = fine ? 2 : 1;
    if (M < 1 || R * M > MAXM || w->k % 32) return -1;
    int ok;
    qact a = qact_new(R * M * w->k, &ok);
    float *out = fine ? malloc(R * M * w->n * sizeof(float)) : y;
    if (!ok || !out) return -2;
    quantize_rows(x, M, w->k, &a, fine);
#pragma omp parallel num_threads(nthreads)
    matmul_rows(w, &a, M, fine, out, w->n);
    if (fine) {
        memcpy(y, out, M * w->n * sizeof(float));
        free(out);
    }
    qact_free(&a);
    return 0;
}

static void rms_norm(const float *x, const float *w, int64_t n, float eps, float *y) {
    float ss = 0.f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

static void rotate(float *x, const float *cos, const float *sin, int64_t half) {
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i] + a * sin[i];
    }
}

/* M rows, each a token at a position of a cache slot: tokens[m] goes to position pos[m] of slot slots[m] and
 * attends over that slot's positions 0..pos[m]. One new token for each of M sequences (a decode step), or
 * the tokens of a prompt (rows of one slot at consecutive positions: every row's keys are written before any
 * row attends), or several prompts' rows. kc / vc: the fp16 caches with strides (in elements) per layer,
 * slot, kv head and position (head_dim contiguous). logits [n_out, vocab] for the rows out_rows[0..n_out).
 * `fine` quantizes every matmul's input in two int8 terms (quantize_fine: ~14 bits, twice the matmul work;
 * for prompts, whose matmuls are bound by compute, not bytes), else in one (decode steps, as MatMulNBits).
 * Returns 0, or < 0 for arguments it cannot take. */
int srt_forward(const srt_model *md, int64_t M, const int64_t *tokens, const int64_t *slots, const int64_t *pos,
                uint16_t *kc, uint16_t *vc, const int64_t *strides, int64_t n_out, const int64_t *out_rows,
                float *logits, int fine, int nthreads) {
    const int64_t dim = md->dim, D = md->head_dim, H = md->n_heads, Hkv = md->n_kv, half = D / 2;
    const int64_t qn = H * D, kvn = Hkv * D, hid = md->hidden, per = H / Hkv;
    const int64_t R = fine ? 2 : 1; /* activation rows per row: fine quantization has two */
    if (M < 1 || R * M > MAXM || n_out < 0 || n_out > M || D % 8 || D > MAXD || per > MAXPER || dim % 32 || hid % 32 ||
        qn % 32)
        return -1;
    for (int64_t i = 0; i < n_out; i++)
        if (out_rows[i] < 0 || out_rows[i] >= M) return -1;
    int64_t maxlen = 0;
    for (int64_t m = 0; m < M; m++) {
        if (pos[m] < 0 || pos[m] >= md->max_pos || tokens[m] < 0 || tokens[m] >= md->vocab) return -2;
        maxlen = pos[m] + 1 > maxlen ? pos[m] + 1 : maxlen;
    }
    const int64_t kmax = hid > dim ? (hid > qn ? hid : qn) : (dim > qn ? dim : qn);
    float *h = malloc(M * dim * sizeof(float)), *x = malloc(M * kmax * sizeof(float));
    float *qkv = malloc(R * M * (qn + 2 * kvn) * sizeof(float)), *att = malloc(M * qn * sizeof(float));
    float *gu = malloc(R * M * 2 * hid * sizeof(float)), *y = malloc(R * M * dim * sizeof(float));
    float *lo = fine && n_out ? malloc(R * n_out * md->vocab * sizeof(float)) : logits;
    float *sc = malloc(M * H * maxlen * sizeof(float));
    /* each row's positions in parts of PART, so that a step of few rows still splits over the threads; the
     * parts depend on the row's length alone, so a row's result does not depend on the rows beside it or the
     * thread count. C: the most parts of any row (the others' extra parts are empty) */
    const int64_t C = (maxlen + PART - 1) / PART;
    float *part_o = malloc(M * H * C * D * sizeof(float)), *part_m = malloc(M * H * C * sizeof(float));
    float *part_s = malloc(M * H * C * sizeof(float));
    const int64_t nq = R * M * kmax;
    int ok;
    qact a = qact_new(nq, &ok);
    if (!h || !x || !qkv || !att || !gu || !y || (n_out && !lo) || !sc || !part_o || !part_m || !part_s || !ok)
        return -3;
    for (int64_t m = 0; m < M; m++) memcpy(h + m * dim, md->emb + tokens[m] * dim, dim * sizeof(float));
    const float scale = 1.f / sqrtf((float)D);

#pragma omp parallel num_threads(nthreads)
    {
        for (int64_t l = 0; l < md->n_layers; l++) {
            const srt_layer *L = md->layers + l;
            uint16_t *kl = kc + l * strides[0], *vl = vc + l * strides[0];
#pragma omp single
            {
                for (int64_t m = 0; m < M; m++) rms_norm(h + m * dim, L->attn_norm, dim, md->eps, x + m * dim);
                quantize_rows(x, M, dim, &a, fine);
            }
            matmul_rows(&L->qkv, &a, M, fine, qkv, qn + 2 * kvn);
#pragma omp single
            for (int64_t m = 0; m < M; m++) { /* bias, head norms, rotary on q and k, then k and v into the cache */
                float *r = qkv + m * (qn + 2 * kvn);
                if (L->qkv_bias)
                    for (int64_t i = 0; i < qn + 2 * kvn; i++) r[i] += L->qkv_bias[i];
                if (L->q_norm) {
                    for (int64_t j = 0; j < H; j++) rms_norm(r + j * D, L->q_norm, D, md->eps, r + j * D);
                    for (int64_t j = 0; j < Hkv; j++) rms_norm(r + qn + j * D, L->k_norm, D, md->eps, r + qn + j * D);
                }
                const float *c = (L->cos ? L->cos : md->cos) + pos[m] * half;
                const float *s = (L->sin ? L->sin : md->sin) + pos[m] * half;
                for (int64_t j = 0; j < H + Hkv; j++) rotate(r + j * D, c, s, half);
                for (int64_t j = 0; j < Hkv; j++) {
                    const int64_t off = slots[m] * strides[1] + j * strides[2] + pos[m] * strides[3];
                    for (int64_t i = 0; i < D; i += 8) {
                        _mm_storeu_si128((__m128i *)(kl + off + i),
                                         _mm256_cvtps_ph(_mm256_loadu_ps(r + qn + j * D + i), 0));
                        _mm_storeu_si128((__m128i *)(vl + off + i),
                                         _mm256_cvtps_ph(_mm256_loadu_ps(r + qn + kvn + j * D + i), 0));
                    }
                }
            }
#pragma omp for schedule(static)
            for (int64_t it = 0; it < M * Hkv * C; it++) { /* a part of a row's positions, one kv head's group */
                const int64_t m = it / (Hkv * C), j = (it / C) % Hkv, c = it % C, T = pos[m] + 1;
                /* a sliding window starts the row's positions at T - window */
                const int64_t first = L->window > 0 && T > L->window ? T - L->window : 0;
                const int64_t t0 = first + c * PART < T ? first + c * PART : T, t1 = t0 + PART < T ? t0 + PART : T;
                const int64_t off = slots[m] * strides[1] + j * strides[2], h0 = m * H + j * per;
                attend_part(qkv + m * (qn + 2 * kvn) + j * per * D, per, kl + off, vl + off, strides[3], t0, t1, D,
                            scale, sc + h0 * maxlen + (t0 - first) * per, part_o + (h0 * C + c) * D,
                            part_m + h0 * C + c, part_s + h0 * C + c, C);
            }
#pragma omp for schedule(static)
            for (int64_t mh = 0; mh < M * H; mh++)
                merge_parts(part_o + mh * C * D, part_m + mh * C, part_s + mh * C, C, D, att + mh * D);
#pragma omp single
            quantize_rows(att, M, qn, &a, fine);
            matmul_rows(&L->o, &a, M, fine, y, dim);
#pragma omp single
            {
                if (L->post_attn_norm)
                    for (int64_t m = 0; m < M; m++) rms_norm(y + m * dim, L->post_attn_norm, dim, md->eps, y + m * dim);
                for (int64_t i = 0; i < M * dim; i++) h[i] += y[i];
                for (int64_t m = 0; m < M; m++) rms_norm(h + m * dim, L->ffn_norm, dim, md->eps, x + m * dim);
                quantize_rows(x, M, dim, &a, fine);
            }
            matmul_rows(&L->gate_up, &a, M, fine, gu, 2 * hid);
#pragma omp for schedule(static)
            for (int64_t i = 0; i < M * hid / 32; i++) { /* act(gate) * up, a block at a time, quantized */
                const int64_t m = i / (hid / 32), j = (i % (hid / 32)) * 32;
                const float *gt = gu + m * 2 * hid + j, *up = gt + hid;
                float *xo = x + m * hid + j;
                for (int k = 0; k < 32; k += 8) {
                    const __m256 g = _mm256_loadu_ps(gt + k);
                    /* silu(g) = g / (1 + exp(-g)); gelu_tanh(g) = g (1 + tanh(u)) / 2 = g / (1 + exp(-2u)),
                     * u = sqrt(2 / pi) (g + 0.044715 g^3) */
                    const __m256 arg =
                        md->act ? _mm256_mul_ps(_mm256_set1_ps(-1.5957691216057308f),
                                                _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), g),
                                                                _mm256_mul_ps(g, g), g))
                                : _mm256_sub_ps(_mm256_setzero_ps(), g);
                    const __m256 e = exp8(arg);
                    const __m256 sg = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e));
                    _mm256_storeu_ps(xo + k, _mm256_mul_ps(sg, _mm256_loadu_ps(up + k)));
                }
                if (fine)
                    quantize_fine(xo, &a, i, M * hid / 32 + i);
                else
                    quantize_block(xo, &a, i);
            }
            matmul_rows(&L->down, &a, M, fine, y, dim);
#pragma omp single
            {
                if (L->post_ffn_norm)
                    for (int64_t m = 0; m < M; m++) rms_norm(y + m * dim, L->post_ffn_norm, dim, md->eps, y + m * dim);
                for (int64_t i = 0; i < M * dim; i++) h[i] += y[i];
            }
        }
#pragma omp single
        {
            for (int64_t i = 0; i < n_out; i++) rms_norm(h + out_rows[i] * dim, md->norm, dim, md->eps, x + i * dim);
            quantize_rows(x, n_out, dim, &a, fine);
        }
        if (n_out > 0) matmul_rows(&md->head, &a, n_out, fine, lo, md->vocab);
    }
    if (lo != logits) {
        memcpy(logits, lo, n_out * md->vocab * sizeof(float));
        free(lo);
    }
    free(h), free(x), free(qkv), free(att), free(gu), free(y), free(sc), free(part_o), free(part_m), free(part_s);
    qact_free(&a);
    return 0;
}
