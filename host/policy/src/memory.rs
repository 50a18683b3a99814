//! Giving freed tensor memory back to the system.
//!
//! libtorch allocates CPU tensors with the C allocator. glibc keeps what a thread frees in that
//! thread's arena, and each arena only gives memory back from its top, so a phase that ran on
//! one thread (decoding on the batching worker) leaves its pages resident while the next phase
//! (the update, on the trainer's thread) allocates fresh ones in another arena: the process's
//! peak becomes the sum of the phases instead of the larger of them. Releasing between phases
//! keeps it at the larger; the next phase pays a few page faults instead.
//!
//! Within a phase the opposite holds: glibc serves every allocation above 32 MiB (a micro-batch's
//! logits, their log-softmax and gradients) with a fresh mapping and unmaps it when freed, so
//! each micro-batch zero-fills the same gigabyte of new pages again. [`HeapReuse`] keeps
//! those in the heap during such a phase, where the next micro-batch reuses them.

/// Returns the whole free pages of every allocator arena to the system. A no-op where the C
/// library is not glibc.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes the arenas' locks
    // and touches no memory a caller holds.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// While alive, large allocations are served from the heap instead of fresh mappings, and freed
/// memory stays there (up to 2 GiB at its top): for a phase that allocates and frees the same
/// large tensors over and over (an RL update's micro-batches: it spent 11% of its time
/// zero-filling new pages without this; BENCHMARKS.md). Dropped, glibc's defaults return, so a
/// phase that follows (decoding) cannot grow the heap the same way; call
/// [`release_free_memory`] after it. Process-wide; a no-op where the C library is not glibc.
#[derive(Debug)]
pub struct HeapReuse(());

impl HeapReuse {
    /// Starts reusing freed memory until the value is dropped.
    pub fn start() -> Self {
        set_mmap_and_trim(0, i32::MAX);
        HeapReuse(())
    }
}

impl Drop for HeapReuse {
    fn drop(&mut self) {
        // glibc's defaults: DEFAULT_MMAP_MAX and DEFAULT_TRIM_THRESHOLD.
        set_mmap_and_trim(65_536, 128 * 1024);
    }
}

fn set_mmap_and_trim(mmap_max: i32, trim_threshold: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's parameters; it takes the main arena's lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, mmap_max);
        libc::mallopt(libc::M_TRIM_THRESHOLD, trim_threshold);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (mmap_max, trim_threshold);
}
