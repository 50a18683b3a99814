//! libtorch's process-wide settings: its CPU threads, the device a policy runs on, and its global
//! random generator.

use crate::PolicyError;

/// Sets the number of CPU threads libtorch uses for intra-op parallelism.
pub fn set_threads(threads: usize) {
    tch::set_num_threads(i32::try_from(threads.max(1)).unwrap_or(i32::MAX));
}

/// Parses a device name: `cpu`, `cuda`, `cuda:N`, or `auto` (CUDA when available).
pub fn parse_device(name: &str) -> Result<tch::Device, PolicyError> {
    let device = match name {
        "auto" => tch::Device::cuda_if_available(),
        "cpu" => tch::Device::Cpu,
        "cuda" => tch::Device::Cuda(0),
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => tch::Device::Cuda(n),
            None => return Err(PolicyError::Device(format!("unknown device {other:?} (auto, cpu, cuda, cuda:N)"))),
        },
    };
    if let tch::Device::Cuda(n) = device {
        let count = tch::Cuda::device_count();
        if n as i64 >= count {
            return Err(PolicyError::Device(format!(
                "{name}: CUDA is not available here ({count} device(s) visible to libtorch)"
            )));
        }
    }
    Ok(device)
}

/// Holds libtorch's global generator, seeded with `seed`, until dropped: two models initialised
/// at once on different threads would interleave their draws, and neither would be the seed's.
pub fn seeded(seed: u64) -> std::sync::MutexGuard<'static, ()> {
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = toolsmith_contract::sync::lock(&INIT);
    tch::manual_seed(seed as i64);
    guard
}
