//! Choosing a batch's next tokens on the host: a draw and its log-prob for each of 32 rows of
//! SmolLM2's 49,152-token vocabulary, as one decode step of a rollout batch needs them. Before:
//! `Sampler::next` then `log_prob`, row after row (two passes of exponentials at a temperature;
//! three until `next` kept its row's weights). After: `Sampler::next_scored` (one pass), rows
//! spread over the cores as `generate` does.
//!
//!   cargo bench --profile dev -p toolsmith-policy --bench sampling [-- --rows 32 --vocab 49152 --rounds 5]
//!
//! Medians over rounds of 20 steps each; both sides in every round.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use toolsmith_policy::SamplingParams;
use toolsmith_policy::sampling::{Sampler, log_prob};

fn number(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).map_or(default, |w| w[1].parse().expect("a number"))
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let (rows, vocab, rounds, steps) = (number("--rows", 32), number("--vocab", 49_152), number("--rounds", 5), 20);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let logits: Vec<Vec<f32>> =
        (0..rows).map(|_| (0..vocab).map(|_| rng.random_range(-12.0_f32..12.0)).collect()).collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).min(rows);
    println!(
        "host sampling, {rows} rows x {vocab} tokens, {cores} core(s), medians of {rounds} rounds of {steps} steps"
    );
    println!(
        "| temperature | before (next + log_prob, one row after another) | after (next_scored, rows over the cores) | speed-up |"
    );
    println!("|---:|---:|---:|---:|");
    for temperature in [1.0, 0.0] {
        let params = SamplingParams { temperature, ..SamplingParams::default() };
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let mut samplers: Vec<Sampler> = (0..rows).map(|i| Sampler::new(&params, i as u64)).collect();
            let t = Instant::now();
            let mut check = 0.0;
            for _ in 0..steps {
                for (s, row) in samplers.iter_mut().zip(&logits) {
                    let token = s.next(row, &[]);
                    check += log_prob(row, token as usize, temperature);
                }
            }
            before.push(t.elapsed().as_secs_f64() * 1e3 / steps as f64);
            let mut samplers: Vec<Sampler> = (0..rows).map(|i| Sampler::new(&params, i as u64)).collect();
            let t = Instant::now();
            let mut check_after = 0.0;
            for _ in 0..steps {
                let chunk = rows.div_ceil(cores);
                check_after += std::thread::scope(|scope| {
                    let handles: Vec<_> = samplers
                        .chunks_mut(chunk)
                        .zip(logits.chunks(chunk))
                        .map(|(s, r)| {
                            scope.spawn(move || {
                                s.iter_mut().zip(r).map(|(s, row)| s.next_scored(row, &[]).1).sum::<f64>()
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().expect("sampling thread")).sum::<f64>()
                });
            }
            after.push(t.elapsed().as_secs_f64() * 1e3 / steps as f64);
            // Same draws, same log-probs (summed in another order).
            assert!((check - check_after).abs() < 1e-6 * check.abs().max(1.0), "{check} vs {check_after}");
        }
        let (b, a) = (median(before), median(after));
        println!("| {temperature} | {b:.1} ms a step | {a:.1} ms a step | **{:.1}x** |", b / a);
    }
}
