/* GPU check of a packaged libmagma.a (magma-cudaXYZ): LU factorisation and solve on the GPU, checked on the CPU.
 *
 *   magma_dgetrf_gpu + magma_dgetrs_gpu and magma_dgesv_gpu, n = 1024 and 8192: scaled residual
 *       ||A x - b||_inf / (||A||_inf ||x||_inf n eps), which must stay below 30 (LAPACK's tester threshold);
 *   magma_dgetrf_batched on many small square matrices (n = 4..32, the smallsq path the official getrf_shfl and
 *       getrf_nbparam changes touch): ||P A - L U||_max / (||A||_max n eps) of every matrix, and the info codes;
 *   magma_dgetrf_gpu GFLOP/s at n = 16384 (2/3 n^3 flops, best of 3).
 *
 * Prints one line per check and exits non-zero when any check fails. Build and run: tests/gpu/run_gpu_check.sh.
 * Compiled (not run) on machines without a GPU or cuBLAS by tests/test_magma_sources.py.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "magma_v2.h"

#define THRESHOLD 30.0

static unsigned long long rng_state = 20261123ULL;

static double uniform(void) {  /* deterministic, in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double) (rng_state >> 11) / 4503599627370496.0 - 1.0;
}

static void fill(double *a, magma_int_t count) {
    for (magma_int_t i = 0; i < count; ++i) a[i] = uniform();
}

static double norm_inf(magma_int_t m, magma_int_t n, const double *a, magma_int_t lda) {
    double best = 0.0;
    for (magma_int_t i = 0; i < m; ++i) {
        double row = 0.0;
        for (magma_int_t j = 0; j < n; ++j) row += fabs(a[i + j * lda]);
        if (row > best) best = row;
    }
    return best;
}

/* ||A x - b||_inf / (||A||_inf ||x||_inf n eps), column-major, on the CPU. */
static double solve_residual(magma_int_t n, const double *a, const double *x, const double *b) {
    double *r = malloc((size_t) n * sizeof(double));
    double rmax = 0.0, xmax = 0.0;
    for (magma_int_t i = 0; i < n; ++i) r[i] = -b[i];
    for (magma_int_t j = 0; j < n; ++j) {
        for (magma_int_t i = 0; i < n; ++i) r[i] += a[i + j * (size_t) n] * x[j];
        if (fabs(x[j]) > xmax) xmax = fabs(x[j]);
    }
    for (magma_int_t i = 0; i < n; ++i) if (fabs(r[i]) > rmax) rmax = fabs(r[i]);
    free(r);
    return rmax / (norm_inf(n, n, a, n) * xmax * n * DBL_EPSILON);
}

static int check_solve(magma_int_t n, int use_gesv, magma_queue_t queue) {
    size_t count = (size_t) n * n;
    magma_int_t ldda = magma_roundup(n, 32), info = 0;
    double *a = malloc(count * sizeof(double)), *b = malloc((size_t) n * sizeof(double));
    double *x = malloc((size_t) n * sizeof(double));
    magma_int_t *ipiv = malloc((size_t) n * sizeof(magma_int_t));
    double *da = NULL, *db = NULL;
    fill(a, (magma_int_t) count);
    fill(b, n);
    magma_dmalloc(&da, (size_t) ldda * n);
    magma_dmalloc(&db, (size_t) ldda);
    magma_dsetmatrix(n, n, a, n, da, ldda, queue);
    magma_dsetmatrix(n, 1, b, n, db, ldda, queue);
    if (use_gesv) {
        magma_dgesv_gpu(n, 1, da, ldda, ipiv, db, ldda, &info);
    } else {
        magma_dgetrf_gpu(n, n, da, ldda, ipiv, &info);
        if (info == 0) magma_dgetrs_gpu(MagmaNoTrans, n, 1, da, ldda, ipiv, db, ldda, &info);
    }
    magma_dgetmatrix(n, 1, db, ldda, x, n, queue);
    double residual = solve_residual(n, a, x, b);
    int ok = info == 0 && residual < THRESHOLD;
    printf("%s n=%d: info %d, scaled residual %.3g (< %g): %s\n",
           use_gesv ? "magma_dgesv_gpu" : "magma_dgetrf_gpu+dgetrs_gpu", (int) n, (int) info, residual, THRESHOLD,
           ok ? "ok" : "FAILED");
    magma_free(da);
    magma_free(db);
    free(a); free(b); free(x); free(ipiv);
    return ok;
}

/* ||P A - L U||_max / (||A||_max n eps) for one factored n x n matrix (LAPACK-style 1-based ipiv). */
static double lu_error(magma_int_t n, const double *a, const double *lu, const magma_int_t *ipiv) {
    double *pa = malloc((size_t) n * n * sizeof(double));
    double amax = 0.0, emax = 0.0;
    for (size_t k = 0; k < (size_t) n * n; ++k) {
        pa[k] = a[k];
        if (fabs(a[k]) > amax) amax = fabs(a[k]);
    }
    for (magma_int_t i = 0; i < n; ++i) {  /* apply the row swaps in order */
        magma_int_t p = ipiv[i] - 1;
        if (p != i) for (magma_int_t j = 0; j < n; ++j) {
            double t = pa[i + j * n]; pa[i + j * n] = pa[p + j * n]; pa[p + j * n] = t;
        }
    }
    for (magma_int_t i = 0; i < n; ++i) {
        for (magma_int_t j = 0; j < n; ++j) {
            double s = 0.0;
            magma_int_t kmax = i < j ? i : j;
            for (magma_int_t k = 0; k <= kmax; ++k) {
                double l = k == i ? 1.0 : lu[i + k * n];
                s += l * lu[k + j * n];
            }
            double e = fabs(pa[i + j * n] - s);
            if (e > emax) emax = e;
        }
    }
    free(pa);
    return emax / (amax * n * DBL_EPSILON);
}

static int check_batched(magma_int_t n, magma_int_t batch, magma_queue_t queue) {
    size_t stride = (size_t) n * n, count = stride * batch;
    double *a = malloc(count * sizeof(double)), *lu = malloc(count * sizeof(double));
    magma_int_t *ipiv = malloc((size_t) n * batch * sizeof(magma_int_t));
    magma_int_t *info = malloc((size_t) batch * sizeof(magma_int_t));
    double *da = NULL, **da_array = NULL;
    magma_int_t *dipiv = NULL, **dipiv_array = NULL, *dinfo = NULL;
    fill(a, (magma_int_t) count);
    magma_dmalloc(&da, count);
    magma_imalloc(&dipiv, (size_t) n * batch);
    magma_imalloc(&dinfo, batch);
    magma_malloc((void **) &da_array, batch * sizeof(double *));
    magma_malloc((void **) &dipiv_array, batch * sizeof(magma_int_t *));
    magma_dsetmatrix(n, n * batch, a, n, da, n, queue);
    magma_dset_pointer(da_array, da, n, 0, 0, n * n, batch, queue);
    magma_iset_pointer(dipiv_array, dipiv, 1, 0, 0, n, batch, queue);
    real_Double_t start = magma_sync_wtime(queue);
    magma_int_t status = magma_dgetrf_batched(n, n, da_array, n, dipiv_array, dinfo, batch, queue);
    real_Double_t seconds = magma_sync_wtime(queue) - start;
    magma_dgetmatrix(n, n * batch, da, n, lu, n, queue);
    magma_igetvector(n * batch, dipiv, 1, ipiv, 1, queue);
    magma_igetvector(batch, dinfo, 1, info, 1, queue);
    double worst = 0.0;
    int bad_info = 0;
    for (magma_int_t k = 0; k < batch; ++k) {
        double e = lu_error(n, a + k * stride, lu + k * stride, ipiv + k * n);
        if (e > worst || isnan(e)) worst = e;
        if (info[k] != 0) ++bad_info;
    }
    int ok = status == 0 && bad_info == 0 && worst < THRESHOLD;
    printf("magma_dgetrf_batched n=%d x %d: status %d, %d nonzero info, worst ||PA-LU|| %.3g (< %g), %.2f ms: %s\n",
           (int) n, (int) batch, (int) status, bad_info, worst, THRESHOLD, seconds * 1e3, ok ? "ok" : "FAILED");
    magma_free(da); magma_free(dipiv); magma_free(dinfo); magma_free(da_array); magma_free(dipiv_array);
    free(a); free(lu); free(ipiv); free(info);
    return ok;
}

static void report_gflops(magma_int_t n, magma_queue_t queue) {
    magma_int_t ldda = magma_roundup(n, 32), info = 0;
    size_t count = (size_t) n * n;
    double *a = malloc(count * sizeof(double)), *da = NULL, best = 1e30;
    magma_int_t *ipiv = malloc((size_t) n * sizeof(magma_int_t));
    fill(a, (magma_int_t) count);
    magma_dmalloc(&da, (size_t) ldda * n);
    for (int run = 0; run < 3; ++run) {
        magma_dsetmatrix(n, n, a, n, da, ldda, queue);
        real_Double_t start = magma_sync_wtime(queue);
        magma_dgetrf_gpu(n, n, da, ldda, ipiv, &info);
        real_Double_t seconds = magma_sync_wtime(queue) - start;
        if (seconds < best) best = seconds;
    }
    double flops = 2.0 / 3.0 * (double) n * n * n;
    printf("magma_dgetrf_gpu n=%d: info %d, best of 3 %.3f s, %.1f GFLOP/s\n", (int) n, (int) info, best,
           flops / best / 1e9);
    magma_free(da);
    free(a); free(ipiv);
}

int main(void) {
    magma_queue_t queue = NULL;
    magma_device_t device = 0;
    int ok = 1;
    if (magma_init() != MAGMA_SUCCESS) {
        printf("magma_init failed\n");
        return 1;
    }
    magma_print_environment();
    magma_getdevice(&device);
    magma_queue_create(device, &queue);
    magma_int_t nbparam = 0, recnb = 0;
    magma_get_dgetrf_batched_nbparam(1024, &nbparam, &recnb);
    printf("magma_get_dgetrf_batched_nbparam: nb %d recnb %d (official getrf_nbparam: 16)\n", (int) nbparam, (int) recnb);
    const magma_int_t sizes[] = {1024, 8192};
    for (int i = 0; i < 2; ++i) {
        ok &= check_solve(sizes[i], 0, queue);
        ok &= check_solve(sizes[i], 1, queue);
    }
    const magma_int_t small[] = {4, 8, 16, 25, 32};
    for (int i = 0; i < 5; ++i) ok &= check_batched(small[i], 10000, queue);
    report_gflops(16384, queue);
    magma_queue_destroy(queue);
    magma_finalize();
    printf("%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
    return ok ? 0 : 1;
}
