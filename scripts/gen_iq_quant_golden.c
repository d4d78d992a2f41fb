// Golden blocks of ggml's lattice i-quant encoders (IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS,
// IQ2_S, IQ1_S, IQ1_M) for crates/gguf/tests/quant_golden.rs.
//
// Build against a llama.cpp build tree and run from the repository root:
//
//     cc -O2 -I$LLAMA/ggml/include scripts/gen_iq_quant_golden.c \
//        -L$LLAMA/build/bin -lggml-base -Wl,-rpath,$LLAMA/build/bin -o /tmp/iqgold
//     /tmp/iqgold > crates/gguf/tests/golden/iq_lattice.txt
//
// The input is generated from a 32-bit LCG with exact float steps, which the Rust test
// repeats: rows of 512 values, roughly normal (sum of four uniforms) with every sixteenth
// value six times larger (heavy tail); the importance weights are 0.5 + uniform. Each
// output line is `TYPE WEIGHTS HEX`, WEIGHTS being `none` (ggml's fallback weights; only
// for the types that accept no imatrix) or `imatrix`.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "ggml.h"

#define ROWS 2
#define COLS 512

static uint32_t state = 12345u;

static float uniform(void) {
    state = state * 1664525u + 1013904223u;
    return (float)(state >> 8) * (1.0f / 16777216.0f);
}

static void emit(enum ggml_type type, const char *name, const float *x, const float *qw) {
    size_t size = ggml_row_size(type, COLS) * ROWS;
    uint8_t *out = calloc(size, 1);
    ggml_quantize_chunk(type, x, out, 0, ROWS, COLS, qw);
    printf("%s %s ", name, qw ? "imatrix" : "none");
    for (size_t i = 0; i < size; ++i) printf("%02x", out[i]);
    printf("\n");
    free(out);
}

int main(void) {
    static float x[ROWS * COLS];
    static float qw[COLS];
    for (int i = 0; i < ROWS * COLS; ++i) {
        float a = uniform(), b = uniform(), c = uniform(), d = uniform();
        float v = ((a + b) + (c + d)) - 2.0f;
        x[i] = (i % 16 == 5) ? 6.0f * v : v;
    }
    for (int i = 0; i < COLS; ++i) qw[i] = 0.5f + uniform();
    const struct { enum ggml_type type; const char *name; int needs_imatrix; } types[] = {
        {GGML_TYPE_IQ3_XXS, "IQ3_XXS", 0}, {GGML_TYPE_IQ3_S, "IQ3_S", 0},
        {GGML_TYPE_IQ2_XXS, "IQ2_XXS", 1}, {GGML_TYPE_IQ2_XS, "IQ2_XS", 1},
        {GGML_TYPE_IQ2_S, "IQ2_S", 0},     {GGML_TYPE_IQ1_S, "IQ1_S", 1},
        {GGML_TYPE_IQ1_M, "IQ1_M", 0},
    };
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); ++t) {
        if (!types[t].needs_imatrix) emit(types[t].type, types[t].name, x, NULL);
        emit(types[t].type, types[t].name, x, qw);
    }
    return 0;
}
