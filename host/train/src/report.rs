//! A run's report: the loss and held-out curves as an SVG (drawn with plotters; text is laid out
//! by the viewer, so no fonts are needed here) and a summary table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::TrainError;
use crate::metrics::{EvalMetrics, IterationMetrics, Record, StepMetrics};

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn plot_error(e: impl std::fmt::Display) -> TrainError {
    TrainError::Config(format!("cannot draw the report: {e}"))
}

/// The training records and the evaluations of a metrics stream.
pub fn split(records: &[Record]) -> (Vec<&StepMetrics>, Vec<&EvalMetrics>) {
    let mut steps = Vec::new();
    let mut evals = Vec::new();
    for r in records {
        match r {
            Record::Train(s) => steps.push(s),
            Record::Eval(e) => evals.push(e),
            Record::Iteration(_) | Record::Resumed(_) => {}
        }
    }
    (steps, evals)
}

/// One panel of lines against the iteration: each series a label and its points.
fn line_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    last: f64,
    series: &[(&str, Vec<(f64, f64)>)],
) -> Result<(), TrainError> {
    let finite = series.iter().flat_map(|(_, p)| p.iter().map(|p| p.1)).filter(|v| v.is_finite());
    let (lo, hi) = finite.fold((0.0_f64, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let pad = ((hi - lo) * 0.05).max(1e-6);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0f64..last, (lo - pad)..(hi + pad))
        .map_err(plot_error)?;
    chart.configure_mesh().x_desc("iteration").x_label_formatter(&|x| format!("{x:.0}")).draw().map_err(plot_error)?;
    for (i, (label, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(plot_error)?
            .label(*label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled()))).map_err(plot_error)?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

/// An RL run's curves: reward and sampled EM, held-out EM per mode, KL, entropy, response length
/// and tool use (created, reused from the graph, other) per iteration.
fn draw_rl(records: &[Record], path: &Path) -> Result<(), TrainError> {
    let its: Vec<&IterationMetrics> =
        records.iter().filter_map(|r| if let Record::Iteration(m) = r { Some(m) } else { None }).collect();
    let (_, evals) = split(records);
    let root = SVGBackend::new(path, (1500, 860)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let panels = root.split_evenly((2, 3));
    let last = its.last().map_or(1, |m| m.iteration).max(evals.last().map_or(1, |e| e.step)).max(1) as f64;
    let per = |f: fn(&IterationMetrics) -> f64| -> Vec<(f64, f64)> {
        its.iter().map(|m| (m.iteration as f64, f(m))).collect()
    };
    line_panel(&panels[0], "reward and sampled EM", last, &[("reward", per(|m| m.reward)), ("EM", per(|m| m.em))])?;
    let modes: std::collections::BTreeSet<&String> = evals.iter().flat_map(|e| e.modes.keys()).collect();
    let heldout: Vec<(&str, Vec<(f64, f64)>)> = modes
        .iter()
        .map(|mode| {
            let points = evals.iter().filter_map(|e| e.modes.get(*mode).map(|f| (e.step as f64, f.em))).collect();
            (mode.as_str(), points)
        })
        .collect();
    line_panel(&panels[1], "held-out exact match", last, &heldout)?;
    line_panel(
        &panels[2],
        "KL per token (k3)",
        last,
        &[("to the reference", per(|m| m.kl)), ("to the sampler", per(|m| m.sampler_kl))],
    )?;
    line_panel(&panels[3], "entropy (nats per token)", last, &[("entropy", per(|m| m.entropy))])?;
    line_panel(
        &panels[4],
        "response tokens per episode",
        last,
        &[("generated", per(|m| m.response_tokens)), ("peak context", per(|m| m.peak_tokens))],
    )?;
    line_panel(
        &panels[5],
        "tool calls per iteration",
        last,
        &[
            ("created", per(|m| m.created_calls as f64)),
            ("reused (graph)", per(|m| m.reused_calls as f64)),
            ("other", per(|m| m.other_calls as f64)),
        ],
    )?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// Draws a run's curves into an SVG file. A supervised run: the loss (and its moving average),
/// held-out EM and format-error rate per mode against the step. An RL run: see `draw_rl`.
pub fn draw(records: &[Record], path: &Path) -> Result<(), TrainError> {
    if records.iter().any(|r| matches!(r, Record::Iteration(_))) {
        return draw_rl(records, path);
    }
    let (steps, evals) = split(records);
    let root = SVGBackend::new(path, (1500, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let panels = root.split_evenly((1, 3));
    let last_step = steps.last().map_or(1, |s| s.step).max(evals.last().map_or(1, |e| e.step)).max(1) as f64;

    let max_loss = steps.iter().map(|s| s.loss).filter(|l| l.is_finite()).fold(0.0_f64, f64::max).max(1e-3);
    let mut chart = ChartBuilder::on(&panels[0])
        .caption("training loss (per assistant token)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..last_step, 0f64..max_loss * 1.05)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(plot_error)?;
    chart
        .draw_series(LineSeries::new(steps.iter().map(|s| (s.step as f64, s.loss)), COLORS[0].mix(0.35)))
        .map_err(plot_error)?
        .label("loss")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], COLORS[0].mix(0.35)));
    let window = (steps.len() / 20).max(1);
    let smooth: Vec<(f64, f64)> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let from = i.saturating_sub(window - 1);
            let mean = steps[from..=i].iter().map(|s| s.loss).sum::<f64>() / (i - from + 1) as f64;
            (s.step as f64, mean)
        })
        .collect();
    chart
        .draw_series(LineSeries::new(smooth, COLORS[0].stroke_width(2)))
        .map_err(plot_error)?
        .label(format!("mean of {window}"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], COLORS[0].stroke_width(2)));
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw().map_err(plot_error)?;

    let modes: Vec<String> = evals
        .iter()
        .flat_map(|e| e.modes.keys().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for (panel, (title, value)) in panels[1..].iter().zip([
        ("held-out exact match", (|f: &crate::metrics::ModeFigures| f.em) as fn(&crate::metrics::ModeFigures) -> f64),
        ("held-out format-error rate (turns)", |f| f.format_error_rate),
    ]) {
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(0f64..last_step, 0f64..1.02)
            .map_err(plot_error)?;
        chart.configure_mesh().x_desc("step").x_label_formatter(&|x| format!("{x:.0}")).draw().map_err(plot_error)?;
        for (i, mode) in modes.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points: Vec<(f64, f64)> =
                evals.iter().filter_map(|e| e.modes.get(mode).map(|f| (e.step as f64, value(f)))).collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(plot_error)?
                .label(mode.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
            chart.draw_series(points.into_iter().map(|p| Circle::new(p, 4, color.filled()))).map_err(plot_error)?;
        }
        if !modes.is_empty() {
            chart
                .configure_series_labels()
                .border_style(BLACK)
                .background_style(WHITE.mix(0.8))
                .position(SeriesLabelPosition::UpperRight)
                .draw()
                .map_err(plot_error)?;
        }
    }
    root.present().map_err(plot_error)?;
    Ok(())
}

/// A summary: steps, loss at the start and the end, throughput, and every mode's held-out
/// figures before and after.
pub fn summary(records: &[Record]) -> String {
    let (steps, evals) = split(records);
    let mut out = String::new();
    if let (Some(first), Some(last)) = (steps.first(), steps.last()) {
        let k = (steps.len() / 10).clamp(1, 20);
        let mean = |s: &[&StepMetrics]| s.iter().map(|m| m.loss).sum::<f64>() / s.len().max(1) as f64;
        let mut rates: Vec<f64> = steps.iter().map(|s| s.tokens_per_sec).collect();
        rates.sort_by(f64::total_cmp);
        let tokens: usize = steps.iter().map(|s| s.tokens).sum();
        let _ = writeln!(
            out,
            "steps {}..{} · {:.2} epochs · {} tokens · loss {:.3} -> {:.3} (means of {k} steps) · median {:.0} tokens/s · {:.0} s",
            first.step,
            last.step,
            last.epoch,
            tokens,
            mean(&steps[..k]),
            mean(&steps[steps.len() - k..]),
            rates[rates.len() / 2],
            last.elapsed_s
        );
    }
    let iterations: Vec<&IterationMetrics> =
        records.iter().filter_map(|r| if let Record::Iteration(m) = r { Some(m) } else { None }).collect();
    if let (Some(first), Some(last)) = (iterations.first(), iterations.last()) {
        let _ = writeln!(
            out,
            "iterations {}..{} · reward {:.3} -> {:.3} · sampled EM {:.2} -> {:.2} · turns cut {:.0}% -> {:.0}% · KL {:.4} (to the sampler {:.4}, clipped {:.2}%) · entropy {:.2} -> {:.2} · {:.0} s",
            first.iteration,
            last.iteration,
            first.reward,
            last.reward,
            first.em,
            last.em,
            100.0 * first.cut_turns,
            100.0 * last.cut_turns,
            last.kl,
            last.sampler_kl,
            100.0 * last.clip_fraction,
            first.entropy,
            last.entropy,
            last.elapsed_s
        );
        if last.graph_tools > 0 {
            let admitted: usize = iterations.iter().map(|m| m.admitted).sum();
            let _ = writeln!(
                out,
                "tool graph: {} tools · {admitted} admitted · calls created/reused/other {}/{}/{} -> {}/{}/{}",
                last.graph_tools,
                first.created_calls,
                first.reused_calls,
                first.other_calls,
                last.created_calls,
                last.reused_calls,
                last.other_calls
            );
        }
    }
    if let (Some(before), Some(after)) = (evals.first(), evals.last()) {
        let _ = writeln!(out, "held-out evaluation: step {} -> step {}", before.step, after.step);
        let _ = writeln!(
            out,
            "{:<8} {:>13} {:>13} {:>13} {:>15} {:>13} {:>8}",
            "mode", "EM", "F1", "turns", "format errors", "answered", "ceiling"
        );
        let modes: BTreeMap<&String, ()> = after.modes.keys().map(|k| (k, ())).collect();
        for mode in modes.keys() {
            let (b, a) = (before.modes.get(*mode), &after.modes[*mode]);
            let pair = |f: fn(&crate::metrics::ModeFigures) -> f64| match b {
                Some(b) => format!("{:.3}->{:.3}", f(b), f(a)),
                None => format!("{:.3}", f(a)),
            };
            let _ = writeln!(
                out,
                "{:<8} {:>13} {:>13} {:>13} {:>15} {:>13} {:>8}",
                mode,
                pair(|f| f.em),
                pair(|f| f.f1),
                pair(|f| f.turns),
                pair(|f| f.format_error_rate),
                pair(|f| f.answered),
                a.ceiling.map_or_else(|| "-".to_string(), |c| format!("{c:.2}"))
            );
        }
        let by_family = |pick: fn(&crate::metrics::ModeFigures) -> &BTreeMap<String, f64>| {
            let families: BTreeMap<&String, Vec<f64>> =
                after.modes.values().flat_map(|m| pick(m).iter()).fold(BTreeMap::new(), |mut acc, (f, x)| {
                    acc.entry(f).or_default().push(*x);
                    acc
                });
            let row: Vec<String> =
                families.iter().map(|(f, xs)| format!("{f} {:.2}", xs.iter().sum::<f64>() / xs.len() as f64)).collect();
            row.join(" · ")
        };
        let _ = writeln!(out, "after, EM by family (mean over modes): {}", by_family(|m| &m.families));
        if after.modes.values().any(|m| !m.family_f1.is_empty()) {
            let _ = writeln!(out, "after, F1 by family (mean over modes): {}", by_family(|m| &m.family_f1));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(step: u64, extra: &str) -> Record {
        let line = format!(
            r#"{{"kind": "eval", "step": {step}, "em": 0.2, "seconds": 1.0, "modes": {{"gap": {{"em": 0.2, "f1": 0.3,
               "turns": 2.0, "format_error_rate": 0.1, "answered": 1.0, "tasks": 20,
               "families": {{"single_hop": 0.4, "multi_objective": 0.0}}{extra}}}}}}}"#
        );
        serde_json::from_str(&line).expect("an eval record")
    }

    #[test]
    fn the_summary_shows_f1_by_family_where_the_run_recorded_it() {
        // A run recorded before F1 by family existed still reads, and shows EM by family only.
        let old = summary(&[eval(0, ""), eval(8, "")]);
        assert!(old.contains("EM by family (mean over modes): multi_objective 0.00 · single_hop 0.40"), "{old}");
        assert!(!old.contains("F1 by family"), "{old}");

        let f1 = r#", "family_f1": {"single_hop": 0.5, "multi_objective": 0.375}"#;
        let new = summary(&[eval(0, f1), eval(8, f1)]);
        assert!(new.contains("F1 by family (mean over modes): multi_objective 0.38 · single_hop 0.50"), "{new}");
    }
}
