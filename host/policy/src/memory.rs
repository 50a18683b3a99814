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
//! each micro-batch zero-fills the same gigabyte of new pages again. [`reuse_freed_memory`]
//! keeps those in the heap, where the next micro-batch reuses them; the releases between phases
//! still bound the peak.

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

/// Serves large allocations from the heap instead of fresh mappings, and keeps freed memory
/// there (up to 2 GiB at its top) until [`release_free_memory`]. For a process that allocates
/// and frees the same large tensors over and over (a training loop's micro-batches): an RL
/// update of `smol-gap` spent 11% of its time zero-filling new pages without it
/// (BENCHMARKS.md). Process-wide; a no-op where the C library is not glibc.
pub fn reuse_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's parameters; it takes the main arena's lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
