//! Floating-point precision of the weights, and what this CPU computes natively: bf16 is chosen
//! only where the hardware runs it faster than f32.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind};

use crate::PolicyError;

/// Floating-point precision of the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// 32-bit floats: exact everywhere, and the only choice on a CPU without native bf16.
    F32,
    /// bfloat16: f32's range in half the bytes, native on CUDA and on CPUs with AVX512_BF16 or AMX.
    Bf16,
    /// IEEE half precision, for checkpoints saved in it.
    F16,
}

impl Precision {
    /// The libtorch element kind tensors of this precision have.
    pub fn kind(self) -> Kind {
        match self {
            Self::F32 => Kind::Float,
            Self::Bf16 => Kind::BFloat16,
            Self::F16 => Kind::Half,
        }
    }

    /// Parses `f32`/`float32`, `bf16`/`bfloat16`, `f16`/`float16`.
    pub fn parse(name: &str) -> Result<Self, PolicyError> {
        match name {
            "f32" | "float32" | "float" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f16" | "float16" | "half" => Ok(Self::F16),
            other => Err(PolicyError::Config(format!("unknown precision {other:?} (f32, bf16, f16)"))),
        }
    }

    /// What `auto` means on `device`: bf16 where the hardware computes it natively (CUDA, or a
    /// CPU with AVX512_BF16 or AMX; see [`cpu_has_bf16`]), f32 elsewhere. Training under bf16
    /// keeps fp32 master weights and fp32 optimizer state.
    pub fn auto(device: Device) -> Self {
        match device {
            Device::Cpu if !cpu_has_bf16() => Self::F32,
            _ => Self::Bf16,
        }
    }

    /// What `auto` means for training on `device`: bf16 on CUDA, and on a CPU only where
    /// training runs faster in it than in f32 ([`cpu_trains_in_bf16`]), f32 elsewhere.
    pub fn auto_for_training(device: Device) -> Self {
        match device {
            Device::Cpu if !cpu_trains_in_bf16() => Self::F32,
            _ => Self::Bf16,
        }
    }

    /// Refuses bf16 on a CPU that would emulate it (several times slower than f32 there).
    pub fn check(self, device: Device) -> Result<(), PolicyError> {
        if self == Self::Bf16 && device == Device::Cpu && !cpu_has_bf16() {
            return Err(PolicyError::Device(
                "bf16 was asked for, but this CPU has neither AVX512_BF16 nor AMX: use precision f32 (or auto)".into(),
            ));
        }
        Ok(())
    }

    /// The precision of tensors of `kind` (anything but bf16 and f16 counts as f32).
    pub(crate) fn of_kind(kind: Kind) -> Self {
        match kind {
            Kind::BFloat16 => Self::Bf16,
            Kind::Half => Self::F16,
            _ => Self::F32,
        }
    }

    /// The name `config.json` uses.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
        }
    }
}

/// Whether this CPU computes bf16 natively (AVX512_BF16 or AMX-BF16). `TOOLSMITH_CPU_BF16=0`
/// or `=1` overrides the detection, e.g. to compare precisions or to test the refusal.
pub fn cpu_has_bf16() -> bool {
    bf16_on_this_cpu().0
}

/// Whether training (forward and backward passes, fp32 master weights) runs faster in bf16 than
/// in f32 on this CPU: with AMX-BF16, or with AVX512_BF16 on an AMD CPU (on a Zen 5, SmolLM2's
/// SFT steps run about 3x f32's). An Intel CPU with AVX512_BF16 but no AMX (or with AMX hidden by
/// a hypervisor) decodes faster in bf16 but trains slower: SFT at 0.76x f32's tokens/s, an RL
/// update at 0.6x (BENCHMARKS.md). `TOOLSMITH_CPU_BF16=0|1` overrides this as it does
/// [`cpu_has_bf16`].
pub fn cpu_trains_in_bf16() -> bool {
    bf16_on_this_cpu().1
}

/// ([`cpu_has_bf16`], [`cpu_trains_in_bf16`]), detected once.
fn bf16_on_this_cpu() -> (bool, bool) {
    static DETECTED: std::sync::OnceLock<(bool, bool)> = std::sync::OnceLock::new();
    *DETECTED.get_or_init(|| match std::env::var("TOOLSMITH_CPU_BF16").as_deref() {
        Ok("0") => (false, false),
        Ok("1") => (true, true),
        _ => {
            let features = CpuFeatures::detect();
            (features.has_bf16(), features.trains_in_bf16())
        }
    })
}

/// The features that decide how this CPU computes bf16.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// The AVX512_BF16 vector instructions (`avx512_bf16` in `/proc/cpuinfo`).
    pub avx512_bf16: bool,
    /// AMX's bf16 tile instructions (`amx_bf16`).
    pub amx_bf16: bool,
    /// An AMD CPU, whose AVX512_BF16 trains faster than f32 where an Intel one's does not.
    pub amd: bool,
}

impl CpuFeatures {
    /// This machine's, from `/proc/cpuinfo` where it exists (AMX's feature names are not stable
    /// in `is_x86_feature_detected!`; the kernel lists them).
    pub fn detect() -> Self {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let mut features = Self::from_cpuinfo(&info);
        features.avx512_bf16 |= detect_avx512_bf16();
        features
    }

    /// The features the first processor of a `/proc/cpuinfo` text lists.
    pub fn from_cpuinfo(info: &str) -> Self {
        let field = |name: &str| {
            info.lines().filter_map(|l| l.split_once(':')).find(|(k, _)| k.trim() == name).map_or("", |(_, v)| v.trim())
        };
        let flags: Vec<&str> = field("flags").split_whitespace().collect();
        CpuFeatures {
            avx512_bf16: flags.contains(&"avx512_bf16"),
            amx_bf16: flags.contains(&"amx_bf16"),
            amd: field("vendor_id") == "AuthenticAMD",
        }
    }

    /// Whether bf16 is native at all: AVX512_BF16 or AMX-BF16.
    pub fn has_bf16(self) -> bool {
        self.avx512_bf16 || self.amx_bf16
    }

    /// Whether training runs faster in bf16 than in f32 (see [`cpu_trains_in_bf16`]).
    pub fn trains_in_bf16(self) -> bool {
        self.amx_bf16 || (self.avx512_bf16 && self.amd)
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_avx512_bf16() -> bool {
    std::arch::is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_avx512_bf16() -> bool {
    false
}
