//! Giving freed tensor memory back to the system.
//!
//! libtorch allocates CPU tensors with the C allocator. glibc keeps what a thread frees in that
//! thread's arena, and each arena only gives memory back from its top, so a phase that ran on
//! one thread (decoding on the batching worker) leaves its pages resident while the next phase
//! (the update, on the trainer's thread) allocates fresh ones in another arena: the process's
//! peak becomes the sum of the phases instead of the larger of them. Releasing between phases
//! keeps it at the larger; the next phase pays a few page faults instead.

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
