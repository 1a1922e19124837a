//! Prefill compute and the layer-wise load/compute pipeline.
//!
//! **FLOPs.** Prefilling `new` tokens after `prefix` cached ones costs
//!
//! ```text
//! F(new, prefix) = 2 x P x new  +  4 x L x d x new x (prefix + new / 2)
//! ```
//!
//! `P` active parameters (two FLOPs per parameter per token: the dense
//! matmuls), `L` layers, `d` attention width (query heads x head dim). The
//! second term is attention: per layer `Q.K^T` and `A.V` each cost
//! `2 x d x new x context`, and the new tokens see on average
//! `prefix + new / 2` tokens (causal mask). Time is `F / (TFLOPS x MFU)`,
//! and both terms are the same for every layer, so a layer takes `1 / L` of
//! it.
//!
//! **Pipeline** (Tutti, seed 000). Layer `l`'s KV must be in HBM before
//! layer `l` computes; loads go one after another on the transfer path, and
//! loading layer `l + 1` overlaps computing layer `l`:
//!
//! ```text
//! loaded[l]   = loaded[l-1] + load[l]
//! computed[l] = max(computed[l-1], loaded[l]) + compute[l]
//! TTFT        = computed[L-1]
//! bubble      = TTFT - sum(compute)       (the GPU waiting on I/O)
//! ```
//!
//! With equal layers that is `load + compute + (L-1) x max(load, compute)`.
//! Without overlap everything loads first: `L x load + L x compute`.

use serde::Serialize;

/// Prefill FLOPs for `new` tokens after `prefix` cached ones, for a model
/// of `active_params` parameters, `layers` layers and attention width
/// `width` (see the module docs).
pub fn prefill_flops(active_params: f64, layers: u32, width: u32, new: f64, prefix: f64) -> f64 {
    let dense = 2.0 * active_params * new;
    let attention = 4.0 * f64::from(layers) * f64::from(width) * new * (prefix + new / 2.0);
    dense + attention
}

/// When a layer-wise prefill finishes and how long the GPU waited.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pipeline {
    /// Time from the first load's start to the last layer's end, seconds.
    pub total_s: f64,
    /// Time the GPU spent waiting on loads, seconds.
    pub bubble_s: f64,
}

/// The pipeline of per-layer `load` and `compute` times (seconds, same
/// length; a missing entry counts as 0).
pub fn pipeline(load: &[f64], compute: &[f64]) -> Pipeline {
    let layers = load.len().max(compute.len());
    let (mut loaded, mut computed, mut busy) = (0.0f64, 0.0f64, 0.0f64);
    for l in 0..layers {
        let c = compute.get(l).copied().unwrap_or(0.0);
        loaded += load.get(l).copied().unwrap_or(0.0);
        computed = computed.max(loaded) + c;
        busy += c;
    }
    Pipeline {
        total_s: computed,
        bubble_s: (computed - busy).max(0.0),
    }
}

/// [`pipeline`] for `layers` equal layers in closed form:
/// `load + compute + (layers - 1) x max(load, compute)`.
pub fn pipeline_uniform(layers: u32, load: f64, compute: f64) -> Pipeline {
    if layers == 0 {
        return Pipeline {
            total_s: 0.0,
            bubble_s: 0.0,
        };
    }
    let total = load + compute + f64::from(layers - 1) * load.max(compute);
    Pipeline {
        total_s: total,
        bubble_s: (total - f64::from(layers) * compute).max(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_form_matches_the_schedule() {
        for (load, compute) in [(1.0, 3.0), (3.0, 1.0), (2.0, 2.0), (0.0, 1.0), (1.0, 0.0)] {
            let g = pipeline(&[load; 7], &[compute; 7]);
            let u = pipeline_uniform(7, load, compute);
            assert!((g.total_s - u.total_s).abs() < 1e-9, "{load} {compute}");
            assert!((g.bubble_s - u.bubble_s).abs() < 1e-9);
        }
    }

    #[test]
    fn compute_bound_hides_all_but_the_first_load() {
        let p = pipeline_uniform(32, 1.2e-3, 3.5e-3);
        // Tutti's worked example: 32 x 3.5 ms of compute, I/O hidden.
        assert!((p.total_s - (1.2e-3 + 32.0 * 3.5e-3)).abs() < 1e-12);
        assert!((p.bubble_s - 1.2e-3).abs() < 1e-12);
    }

    #[test]
    fn flops_on_hand_values() {
        // 2 x 10 x 4 + 4 x 2 x 3 x 4 x (5 + 2) = 80 + 672.
        assert_eq!(prefill_flops(10.0, 2, 3, 4.0, 5.0), 752.0);
        assert_eq!(prefill_flops(10.0, 2, 3, 0.0, 5.0), 0.0);
    }
}
