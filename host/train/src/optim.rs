//! The optimiser: AdamW with decoupled weight decay, a warm-up + cosine learning-rate schedule and
//! global-norm gradient clipping.
//!
//! Written here rather than taken from `tch::nn::Optimizer` because tch's optimiser keeps its
//! moments inside libtorch with no way to read or restore them, and a run that resumes after a
//! crash must continue with exactly the moments it had. The update is PyTorch's `AdamW`
//! (`torch.optim.AdamW`, single-tensor path) term for term, so a run here and a PyTorch run with
//! the same settings take the same steps.
//!
//! With bf16 weights (the default on CUDA) the optimiser keeps an fp32 master copy of every
//! parameter: the update is computed and accumulated in fp32 and copied into the bf16 weights, so
//! small updates are not rounded away. With fp32 weights the parameter is its own master.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use toolsmith_policy::tch::{self, Kind, Tensor};

use crate::TrainError;

/// AdamW's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdamWConfig {
    /// First-moment decay. By default 0.9.
    pub beta1: f64,
    /// Second-moment decay. By default 0.95 (the usual choice for transformers; PyTorch's 0.999
    /// adapts too slowly to the loss spikes of small-batch training).
    pub beta2: f64,
    /// Added to the denominator. By default 1e-8.
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices only (not to norms and biases). By default 0.01.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.01 }
    }
}

struct Param {
    name: String,
    /// The model's variable (shares storage with the var store).
    var: Tensor,
    /// fp32 master copy when `var` is in lower precision.
    master: Option<Tensor>,
    m: Tensor,
    v: Tensor,
    decay: bool,
}

impl std::fmt::Debug for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Param").field("name", &self.name).field("decay", &self.decay).finish_non_exhaustive()
    }
}

/// AdamW over a set of named variables.
#[derive(Debug)]
pub struct AdamW {
    params: Vec<Param>,
    config: AdamWConfig,
    /// Updates applied so far (the bias corrections' t).
    steps: u64,
}

impl AdamW {
    /// An optimiser for `variables` (name -> trainable tensor), with zero moments.
    pub fn new(variables: BTreeMap<String, Tensor>, config: AdamWConfig) -> Self {
        let params = variables
            .into_iter()
            .filter(|(_, var)| var.requires_grad())
            .map(|(name, var)| {
                let master = (var.kind() != Kind::Float).then(|| var.detach().to_kind(Kind::Float));
                let zeros = || Tensor::zeros(var.size(), (Kind::Float, var.device()));
                // Norm weights and biases are vectors; decaying them only fights the model.
                let decay = var.dim() >= 2;
                Param { name, m: zeros(), v: zeros(), master, var, decay }
            })
            .collect();
        AdamW { params, config, steps: 0 }
    }

    /// Updates applied so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Clears every gradient.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.var.zero_grad();
        }
    }

    /// The global L2 norm of the gradients (before clipping).
    pub fn grad_norm(&self) -> f64 {
        let mut total = 0.0;
        for p in &self.params {
            let g = p.var.grad();
            if g.defined() {
                let n = g.to_kind(Kind::Float).norm().double_value(&[]);
                total += n * n;
            }
        }
        total.sqrt()
    }

    /// Scales the gradients so their global norm is at most `max_norm` (when it is positive) and
    /// returns the norm before clipping.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        let norm = self.grad_norm();
        if max_norm > 0.0 && norm.is_finite() && norm > max_norm {
            let scale = max_norm / (norm + 1e-6);
            tch::no_grad(|| {
                for p in &mut self.params {
                    let mut g = p.var.grad();
                    if g.defined() {
                        let _ = g.g_mul_scalar_(scale);
                    }
                }
            });
        }
        norm
    }

    /// One AdamW update with learning rate `lr`, from the current gradients.
    pub fn step(&mut self, lr: f64) {
        self.steps += 1;
        let c = self.config;
        let t = self.steps as i32;
        let bias1 = 1.0 - c.beta1.powi(t);
        let bias2_sqrt = (1.0 - c.beta2.powi(t)).sqrt();
        tch::no_grad(|| {
            for p in &mut self.params {
                let grad = p.var.grad();
                if !grad.defined() {
                    continue;
                }
                let grad = grad.to_kind(Kind::Float);
                let _ = p.m.g_mul_scalar_(c.beta1).g_add_(&(&grad * (1.0 - c.beta1)));
                let _ = p.v.g_mul_scalar_(c.beta2).g_add_(&(&grad * &grad * (1.0 - c.beta2)));
                let target = p.master.as_mut().unwrap_or(&mut p.var);
                if p.decay && c.weight_decay != 0.0 {
                    let _ = target.g_mul_scalar_(1.0 - lr * c.weight_decay);
                }
                let denom = (p.v.sqrt() / bias2_sqrt) + c.eps;
                let _ = target.g_sub_(&(&p.m / denom * (lr / bias1)));
                if let Some(master) = &p.master {
                    p.var.copy_(master);
                }
            }
        });
    }

    /// Moments (and master weights) as named tensors: `m.NAME`, `v.NAME`, `master.NAME`.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for p in &self.params {
            out.push((format!("m.{}", p.name), p.m.shallow_clone()));
            out.push((format!("v.{}", p.name), p.v.shallow_clone()));
            if let Some(master) = &p.master {
                out.push((format!("master.{}", p.name), master.shallow_clone()));
            }
        }
        out
    }

    /// Writes the state to a safetensors file.
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        let named = self.state_tensors();
        Tensor::write_safetensors(&named, path).map_err(|e| TrainError::checkpoint(path, e.to_string()))
    }

    /// Restores the state saved by [`AdamW::save`] after `steps` updates; every tensor must be
    /// there with the right shape.
    pub fn load(&mut self, path: &Path, steps: u64) -> Result<(), TrainError> {
        let tensors: BTreeMap<String, Tensor> = Tensor::read_safetensors(path)
            .map_err(|e| TrainError::checkpoint(path, format!("unreadable optimiser state: {e}")))?
            .into_iter()
            .collect();
        let take = |key: String, like: &Tensor| -> Result<Tensor, TrainError> {
            let t = tensors
                .get(&key)
                .ok_or_else(|| TrainError::checkpoint(path, format!("optimiser state has no {key}")))?;
            if t.size() != like.size() {
                return Err(TrainError::checkpoint(
                    path,
                    format!("{key} has shape {:?}, the model needs {:?}", t.size(), like.size()),
                ));
            }
            Ok(t.to_kind(Kind::Float).to_device(like.device()))
        };
        for p in &mut self.params {
            let m = take(format!("m.{}", p.name), &p.m)?;
            let v = take(format!("v.{}", p.name), &p.v)?;
            tch::no_grad(|| {
                p.m.copy_(&m);
                p.v.copy_(&v);
            });
            if let Some(master) = &mut p.master {
                let saved = take(format!("master.{}", p.name), master)?;
                tch::no_grad(|| master.copy_(&saved));
            }
        }
        self.steps = steps;
        Ok(())
    }
}

/// Linear warm-up to the peak learning rate, then cosine decay to `min_ratio` of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// The peak learning rate.
    pub peak: f64,
    /// Steps of linear warm-up.
    pub warmup: u64,
    /// Steps in all.
    pub total: u64,
    /// The final learning rate as a share of the peak.
    pub min_ratio: f64,
}

impl Schedule {
    /// The learning rate of optimiser step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.peak * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let progress = ((step - self.warmup) as f64 / span).min(1.0);
        let min = self.peak * self.min_ratio;
        min + 0.5 * (self.peak - min) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_follows_the_cosine() {
        let s = Schedule { peak: 1e-3, warmup: 4, total: 14, min_ratio: 0.1 };
        assert!((s.lr(0) - 2.5e-4).abs() < 1e-12);
        assert!((s.lr(3) - 1e-3).abs() < 1e-12);
        assert!((s.lr(4) - 1e-3).abs() < 1e-12);
        // Half way through the decay: the mean of peak and floor.
        assert!((s.lr(9) - 0.55e-3).abs() < 1e-12);
        assert!((s.lr(14) - 1e-4).abs() < 1e-12);
        assert!((s.lr(100) - 1e-4).abs() < 1e-12);
    }

    /// Two AdamW steps on f(w) = sum(w * c), worked by hand from the update rule.
    #[test]
    fn adamw_matches_the_update_worked_by_hand() {
        let w = Tensor::from_slice(&[1.0_f32, -2.0]).view([1, 2]).set_requires_grad(true);
        let c = Tensor::from_slice(&[0.5_f32, -1.0]).view([1, 2]);
        let config = AdamWConfig { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1 };
        let mut opt = AdamW::new(BTreeMap::from([("w".to_string(), w.shallow_clone())]), config);
        let (lr, mut expected) = (0.01, [1.0_f64, -2.0]);
        let (mut m, mut v) = ([0.0_f64; 2], [0.0_f64; 2]);
        let grads = [0.5, -1.0];
        for t in 1..=2 {
            opt.zero_grad();
            (&w * &c).sum(Kind::Float).backward();
            opt.step(lr);
            for i in 0..2 {
                m[i] = 0.9 * m[i] + 0.1 * grads[i];
                v[i] = 0.99 * v[i] + 0.01 * grads[i] * grads[i];
                let m_hat = m[i] / (1.0 - 0.9_f64.powi(t));
                let denom = v[i].sqrt() / (1.0 - 0.99_f64.powi(t)).sqrt() + 1e-8;
                expected[i] = expected[i] * (1.0 - lr * 0.1) - lr * m_hat / denom;
            }
        }
        let got: Vec<f32> = Vec::try_from(w.view([-1])).expect("values");
        for i in 0..2 {
            assert!((got[i] as f64 - expected[i]).abs() < 1e-6, "{got:?} vs {expected:?}");
        }
    }

    #[test]
    fn clipping_scales_the_global_norm() {
        let a = Tensor::from_slice(&[3.0_f32, 0.0]).view([1, 2]).set_requires_grad(true);
        let b = Tensor::from_slice(&[0.0_f32, 4.0]).view([1, 2]).set_requires_grad(true);
        let mut opt = AdamW::new(
            BTreeMap::from([("a".to_string(), a.shallow_clone()), ("b".to_string(), b.shallow_clone())]),
            AdamWConfig::default(),
        );
        // Gradients equal to the values: norm 5.
        ((&a * &a).sum(Kind::Float) * 0.5 + (&b * &b).sum(Kind::Float) * 0.5).backward();
        let norm = opt.clip_grad_norm(1.0);
        assert!((norm - 5.0).abs() < 1e-5);
        assert!((opt.grad_norm() - 1.0).abs() < 1e-4);
    }

    #[test]
    fn state_round_trips_and_bf16_keeps_an_fp32_master() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w =
            Tensor::from_slice(&[1.0_f32, 2.0, 3.0, 4.0]).view([2, 2]).to_kind(Kind::BFloat16).set_requires_grad(true);
        let mut opt = AdamW::new(BTreeMap::from([("w".to_string(), w.shallow_clone())]), AdamWConfig::default());
        (&w * &w).sum(Kind::Float).backward();
        // An update far below bf16's resolution at 1.0 (2^-8) accumulates in the master.
        for _ in 0..3 {
            opt.step(1e-4);
        }
        let state = opt.state_tensors();
        let master = &state.iter().find(|(n, _)| n == "master.w").expect("master").1;
        assert_eq!(master.kind(), Kind::Float);
        assert!((master.double_value(&[0, 0]) - (1.0 - 3e-4 * (1.0 + 1e-6))).abs() < 2e-5, "{master}");
        let path = dir.path().join("opt.safetensors");
        opt.save(&path).expect("save");
        let mut restored = AdamW::new(BTreeMap::from([("w".to_string(), w.shallow_clone())]), AdamWConfig::default());
        restored.load(&path, 3).expect("load");
        for ((na, a), (nb, b)) in opt.state_tensors().iter().zip(restored.state_tensors().iter()) {
            assert_eq!(na, nb);
            assert!(a.equal(b), "{na}");
        }
        let other = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let mut wrong = AdamW::new(BTreeMap::from([("w".to_string(), other)]), AdamWConfig::default());
        let err = wrong.load(&path, 3).expect_err("shape");
        assert!(err.to_string().contains("shape"), "{err}");
    }
}
