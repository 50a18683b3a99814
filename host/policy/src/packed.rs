//! oneDNN's prepacked linear layer for generation on the CPU.
//!
//! `Tensor::linear` hands the CPU's matrix product a plain `[out, in]` weight, which (as we read
//! it) oneDNN reorders into its blocked layout on every call: at a decode step's 2-16 rows, where
//! reading the weights is the whole cost, the products cost twice what one row's do. A weight reordered
//! once (libtorch's `mkldnn::_reorder_linear_weight`, run by `mkldnn::_linear_pointwise`: what
//! `torch.compile` emits for CPU linears) is read once, at the memory's bandwidth. In PyTorch on
//! this project's 2-core machine, SmolLM2-135M's 121 products at 8 rows: bf16 26 ms plain, 17 ms
//! packed (the same bits); f32 86 and 40 ms (BENCHMARKS.md, decoding). tch wraps neither
//! operator, so `csrc/packed_linear.cpp` calls them through libtorch's dispatcher.

use std::ffi::{CStr, c_char};
use std::sync::OnceLock;

use tch::{Device, Kind, Tensor};
use torch_sys::C_tensor;

unsafe extern "C" {
    fn toolsmith_pack_linear_weight(
        weight: *const C_tensor,
        batch: i64,
        out: *mut *mut C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn toolsmith_packed_linear(
        x: *const C_tensor,
        packed: *const C_tensor,
        bias: *const C_tensor,
        out: *mut *mut C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
}

/// What libtorch said when a packed operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("oneDNN's packed linear failed: {0}")]
pub struct PackedError(String);

/// The rows a decode step's inputs usually have, which oneDNN tunes the layout for (any count works).
const TUNED_ROWS: i64 = 8;

/// Calls one of the shim's functions, which writes a new tensor into `out` or a message into its
/// error buffer.
fn call(f: impl FnOnce(*mut *mut C_tensor, *mut c_char, usize) -> i32) -> Result<Tensor, PackedError> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    let mut err = [0 as c_char; 512];
    let status = f(&mut out, err.as_mut_ptr(), err.len());
    if status != 0 || out.is_null() {
        // The shim always terminates the message.
        let message = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
        return Err(PackedError(message));
    }
    // The shim allocated `out` with `new at::Tensor`, which is what tch frees on drop.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// `weight` `[out, in]` in oneDNN's layout for [`linear`]: an opaque tensor of the same values.
pub fn pack(weight: &Tensor) -> Result<Tensor, PackedError> {
    call(|out, err, len| unsafe { toolsmith_pack_linear_weight(weight.as_ptr(), TUNED_ROWS, out, err, len) })
}

/// `x W^T + bias` for `x` `[.., in]` and `packed` from [`pack`]; the result has `x`'s leading
/// dimensions and kind.
pub fn linear(x: &Tensor, packed: &Tensor, bias: Option<&Tensor>) -> Result<Tensor, PackedError> {
    // oneDNN checks less than this; a mismatch must be an error, never a read out of bounds.
    let (columns, input) = (x.size().last().copied(), packed.size().get(1).copied());
    if columns != input {
        return Err(PackedError(format!("an input of {columns:?} columns for a weight of {input:?}")));
    }
    let bias = bias.map_or(std::ptr::null(), Tensor::as_ptr);
    call(|out, err, len| unsafe { toolsmith_packed_linear(x.as_ptr(), packed.as_ptr(), bias, out, err, len) })
}

/// Whether generation should pack the weights of a model of `kind` on `device`: bf16 or f32 on
/// the CPU (f32 gains as much: 53 -> 33 ms at one row, 86 -> 40 at 8), where the check below has
/// passed once in this process. Elsewhere (CUDA, other kinds, a libtorch without oneDNN)
/// generation keeps plain weights.
pub fn worthwhile(device: Device, kind: Kind) -> bool {
    static BF16: OnceLock<bool> = OnceLock::new();
    static F32: OnceLock<bool> = OnceLock::new();
    match (device, kind) {
        (Device::Cpu, Kind::BFloat16) => *BF16.get_or_init(|| check(kind)),
        (Device::Cpu, Kind::Float) => *F32.get_or_init(|| check(kind)),
        _ => false,
    }
}

/// Packs a small weight of `kind` and compares its product with `Tensor::linear`'s.
fn check(kind: Kind) -> bool {
    let result = tch::no_grad(|| -> Result<bool, PackedError> {
        // Fixed values, not random draws: a draw from libtorch's one global generator could
        // land inside another thread's seeded initialisation (or a training step's dropout) and
        // change what that seed gives.
        let values = |shape: &[i64], phase: f64| {
            let n: i64 = shape.iter().product();
            // Small, so that a product's bf16 rounding stays far below the tolerance.
            ((Tensor::arange(n, (Kind::Float, Device::Cpu)) * 0.7 + phase).sin() * 0.25).reshape(shape).to_kind(kind)
        };
        let weight = values(&[24, 40], 0.0);
        let bias = values(&[24], 1.0);
        let x = values(&[3, 40], 2.0);
        let got = linear(&x, &pack(&weight)?, Some(&bias))?;
        let want = x.linear(&weight, Some(&bias));
        let diff = (got.to_kind(Kind::Float) - want.to_kind(Kind::Float)).abs().max().double_value(&[]);
        Ok(diff <= 0.05)
    });
    match result {
        Ok(true) => true,
        Ok(false) => {
            tracing::warn!("oneDNN's packed linear disagrees with the plain one; generation keeps plain weights");
            false
        }
        Err(e) => {
            tracing::info!("generation keeps plain weights: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_product_is_the_plain_one() {
        tch::manual_seed(7);
        // Every x86 CPU libtorch runs on packs f32; bf16 needs AVX-512 (or AVX-NE-CONVERT), which
        // some CPUs lack, and there the policy keeps plain bf16 weights.
        assert!(worthwhile(Device::Cpu, Kind::Float), "this libtorch has oneDNN's packed linear for f32");
        let kinds = [Kind::BFloat16, Kind::Float].into_iter().filter(|&k| worthwhile(Device::Cpu, k));
        for kind in kinds {
            let rand = |shape: &[i64]| Tensor::randn(shape, (kind, Device::Cpu));
            let weight = rand(&[96, 64]);
            let bias = rand(&[96]);
            let packed = pack(&weight).expect("packs");
            // One row, a decode step's rows (as 3-D `[b, 1, in]`), a prefill's, and a strided input.
            for x in [rand(&[1, 64]), rand(&[8, 1, 64]), rand(&[2, 37, 64]), rand(&[64, 5]).tr()] {
                for b in [None, Some(&bias)] {
                    let got = linear(&x, &packed, b).expect("runs");
                    let want = x.linear(&weight, b);
                    assert_eq!(got.size(), want.size());
                    assert_eq!(got.kind(), kind);
                    let diff = (got.to_kind(Kind::Float) - want.to_kind(Kind::Float)).abs().max().double_value(&[]);
                    let scale = want.to_kind(Kind::Float).abs().max().double_value(&[]);
                    let (shape, bias) = (x.size(), b.is_some());
                    assert!(diff <= scale * 1e-2, "{kind:?} {shape:?} bias {bias}: off by {diff} (scale {scale})");
                }
            }
        }
    }

    #[test]
    fn a_wrong_shape_is_an_error_not_a_crash() {
        // The kind this CPU packs (bf16 where it can).
        let kind = if worthwhile(Device::Cpu, Kind::BFloat16) { Kind::BFloat16 } else { Kind::Float };
        let rand = |shape: &[i64]| Tensor::randn(shape, (kind, Device::Cpu));
        let packed = pack(&rand(&[16, 32])).expect("packs");
        let err = linear(&rand(&[2, 31]), &packed, None).expect_err("31 columns against 32");
        assert!(err.to_string().starts_with("oneDNN's packed linear failed:"), "{err}");
        assert!(!worthwhile(Device::Cpu, Kind::Half), "half precision keeps plain weights");
    }
}
