//! Grids of replay configurations: policies x tier layouts.

use serde::Serialize;

use crate::policy::PolicyKind;
use crate::replay::{ReplayConfig, TierSpec};

/// Policies crossed with tier layouts; the shared replay options.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grid {
    /// Eviction policies.
    pub policies: Vec<PolicyKind>,
    /// Tier layouts, each fastest first (a single tier is a capacity).
    pub layouts: Vec<Vec<TierSpec>>,
    /// Idle time after which the TTL policy drops a block.
    pub ttl_ms: Option<u64>,
    /// Points of each hit-rate timeline.
    pub timeline_points: usize,
    /// Seed of randomised policies.
    pub seed: u64,
    /// Leaves before parents in every tier, as the node does. Default: true.
    pub leaf_first: bool,
}

impl Grid {
    /// `policies` x single tiers called `tier` of each of `capacities`
    /// blocks.
    pub fn capacities(policies: &[PolicyKind], capacities: &[u64], tier: &str) -> Self {
        let layouts = capacities
            .iter()
            .map(|&c| {
                vec![TierSpec {
                    name: tier.to_owned(),
                    capacity_blocks: c,
                }]
            })
            .collect();
        Grid {
            policies: policies.to_vec(),
            layouts,
            ttl_ms: None,
            timeline_points: 50,
            seed: 0,
            leaf_first: true,
        }
    }

    /// Number of configurations (policies x layouts).
    pub fn len(&self) -> usize {
        self.policies.len() * self.layouts.len()
    }

    /// True when the grid has no configuration.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every configuration, policy-major (all layouts of the first policy
    /// first), outcomes not kept.
    pub fn configs(&self) -> Vec<ReplayConfig> {
        self.policies
            .iter()
            .flat_map(|&policy| {
                self.layouts.iter().map(move |tiers| ReplayConfig {
                    policy,
                    tiers: tiers.clone(),
                    ttl_ms: self.ttl_ms,
                    timeline_points: self.timeline_points,
                    seed: self.seed,
                    keep_outcomes: false,
                    leaf_first: self.leaf_first,
                })
            })
            .collect()
    }
}

/// Every tier layout that picks one size per tier: the cartesian product of
/// `per_tier` (`(tier name, candidate sizes in blocks)`, fastest first).
/// A tier whose size is 0 is left out of its layout.
pub fn tier_candidates(per_tier: &[(String, Vec<u64>)]) -> Vec<Vec<TierSpec>> {
    let mut layouts: Vec<Vec<TierSpec>> = vec![Vec::new()];
    for (name, sizes) in per_tier {
        layouts = layouts
            .iter()
            .flat_map(|layout| {
                sizes.iter().map(move |&size| {
                    let mut l = layout.clone();
                    if size > 0 {
                        l.push(TierSpec {
                            name: name.clone(),
                            capacity_blocks: size,
                        });
                    }
                    l
                })
            })
            .collect();
    }
    layouts.retain(|l| !l.is_empty());
    layouts
}
