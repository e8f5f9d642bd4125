// x @ w^T + bias for a few rows (a decode step's, a short prompt's), on the
// CPU, reading the weights once and without copying them.
//
// at::linear on OpenBLAS packs (copies) the whole weight matrix into its
// tile layout on every call. For a prefill's thousands of rows that copy is
// paid once for many rows; for a decode step's 1-16 rows it costs about half
// as much again as the multiply (perf over a 16-stream decode run:
// sgemm_incopy 14% of the samples against sgemm_kernel 28%), and a prompt of
// a few dozen rows does not repay it either. This kernel reads w in place,
// [out, in] row-major, and multiplies each weight into up to 16 rows held in
// registers; more rows take more passes, run 12 weight rows at a time so the
// later passes find them in cache: a call reads its weights from memory once.
//
// Batch invariance: every output element is one sequential fused
// multiply-add chain over `in` (then + bias), whatever the number of rows,
// the row's place in the batch, the thread count or the column split. A
// request's logits therefore do not depend, bit for bit, on which requests
// share its decode step. Against at::linear only the summation order
// differs (tests/engine/small_batch_linear_test.cc).
#ifndef INFOFLOW_ENGINE_MODEL_SMALL_BATCH_LINEAR_H_
#define INFOFLOW_ENGINE_MODEL_SMALL_BATCH_LINEAR_H_

#include <ATen/core/Tensor.h>

namespace infoflow {

// True when SmallBatchLinearCpu runs these operands: x [rows, in] and w
// [out, in] float32 on the CPU with unit inner stride, bias undefined or
// float32 [out] contiguous, and a CPU with AVX2 and FMA. Any row count (the
// kernel takes 16 rows per pass over w).
bool SmallBatchLinearCpuSupports(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);

// x @ w^T (+ bias): [rows, out] float32, contiguous. Output columns are split
// over up to `threads` threads (the caller's thread takes one part) when
// the work pays for a thread start. Requires SmallBatchLinearCpuSupports.
at::Tensor SmallBatchLinearCpu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                               int threads);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_SMALL_BATCH_LINEAR_H_
