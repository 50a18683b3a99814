//! Drawing the next tokens: every running row's at once (over the machine's cores), or one row's
//! under a constraint; and the logits they are drawn from, as host rows.

use tch::{Device, Kind, Tensor};

use crate::PolicyError;
use crate::sampling::Sampler;

use super::Constraint;
use super::sequence::Sequence;

/// Each running row's next token and its log-prob ([`Sampler::next_scored`]), rows spread over
/// the machine's cores: the model's threads are idle meanwhile, and a batch's rows cost a pass
/// over the vocabulary each. `None` for a finished row. Each row draws from its own generator,
/// so the result does not depend on how rows are split.
pub(super) fn sample_rows(seqs: &mut [Sequence], rows: &[Vec<f32>]) -> Vec<Option<(i64, f64)>> {
    // Below about a millisecond of work (a few rows of a large vocabulary) a thread costs more
    // than it saves.
    sample_rows_over_threads(seqs, rows, 1 << 18)
}

fn sample_rows_over_threads(seqs: &mut [Sequence], rows: &[Vec<f32>], min_work: usize) -> Vec<Option<(i64, f64)>> {
    fn pick(seqs: &mut [Sequence], rows: &[Vec<f32>]) -> Vec<Option<(i64, f64)>> {
        seqs.iter_mut()
            .zip(rows)
            .map(|(s, row)| s.finish.is_none().then(|| s.sampler.next_scored(row, &s.seen)))
            .collect()
    }
    // Asked once: on Linux the answer reads the cgroup's CPU quota from files.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let running = seqs.iter().filter(|s| s.finish.is_none()).count();
    if running * rows.first().map_or(0, Vec::len) < min_work {
        return pick(seqs, rows);
    }
    let workers = (*CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))).min(running);
    if workers <= 1 {
        return pick(seqs, rows);
    }
    let chunk = seqs.len().div_ceil(workers);
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            seqs.chunks_mut(chunk).zip(rows.chunks(chunk)).map(|(s, r)| scope.spawn(move || pick(s, r))).collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// Draws under a constraint: mask, draw, check, and on rejection remove the token and draw
/// again. `None` when no token is allowed.
pub(super) fn constrained_next(
    c: &mut dyn Constraint,
    i: usize,
    row: &[f32],
    sampler: &mut Sampler,
    seen: &[i64],
) -> Option<i64> {
    let mut masked = row.to_vec();
    c.mask(i, &mut masked);
    // Rejection is cheap while most survivors of the mask are allowed; after a few misses, check
    // every survivor once and draw from what is left.
    for _ in 0..16 {
        if !masked.iter().any(|l| l.is_finite()) {
            return None;
        }
        let token = sampler.next(&masked, seen);
        if masked[token as usize].is_finite() && c.allows(i, token) {
            return Some(token);
        }
        masked[token as usize] = f32::NEG_INFINITY;
    }
    for (token, l) in masked.iter_mut().enumerate() {
        if l.is_finite() && !c.allows(i, token as i64) {
            *l = f32::NEG_INFINITY;
        }
    }
    if !masked.iter().any(|l| l.is_finite()) {
        return None;
    }
    Some(sampler.next(&masked, seen))
}

/// The last-position logits of each row, as f32 on the CPU (sampling happens in Rust).
pub(super) fn logits_rows(logits: &Tensor, vocab: i64) -> Result<Vec<Vec<f32>>, PolicyError> {
    let flat = logits.to_kind(Kind::Float).to_device(Device::Cpu).contiguous().view([-1]);
    let values = Vec::<f32>::try_from(&flat).map_err(PolicyError::Torch)?;
    Ok(values.chunks(vocab as usize).map(<[f32]>::to_vec).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::FinishReason;
    use crate::sampling::SamplingParams;

    fn sequences(params: &SamplingParams, n: usize) -> Vec<Sequence> {
        (0..n)
            .map(|i| Sequence {
                prompt: vec![1],
                output: Vec::new(),
                logprobs: Vec::new(),
                seen: vec![1],
                sampler: Sampler::new(params, i as u64),
                // A finished row in the middle is skipped, whichever thread holds it.
                finish: (i == 3).then_some(FinishReason::Eos),
                streamed: 0,
                stop_at: None,
            })
            .collect()
    }

    #[test]
    fn rows_sampled_over_threads_draw_as_on_one() {
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
        let rows: Vec<Vec<f32>> =
            (0..9).map(|_| (0..1_000).map(|_| rand::Rng::random_range(&mut rng, -5.0_f32..5.0)).collect()).collect();
        for temperature in [1.0, 0.0] {
            let params = SamplingParams { temperature, ..SamplingParams::default() };
            let (mut alone, mut spread) = (sequences(&params, 9), sequences(&params, 9));
            for _ in 0..4 {
                let one = sample_rows_over_threads(&mut alone, &rows, usize::MAX);
                let many = sample_rows_over_threads(&mut spread, &rows, 0);
                assert_eq!(one, many);
                assert_eq!(one.iter().filter(|p| p.is_none()).count(), 1);
                assert!(one[3].is_none());
            }
        }
    }
}
