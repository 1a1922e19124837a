//! Root-first order of blocks of prefix chains: each chain contiguous,
//! every parent before its children.
//!
//! The block manager writes each round's moves to a tier in this order, so
//! a chain lands on adjacent disk slots root first and a later prefix hit
//! reads it as runs; the optimizer's replay moves its victims in the same
//! order, so both fill lower tiers alike.

/// A depth-first preorder of the forest `up` describes: `up[i]` is the
/// position of item `i`'s parent among the items (`None` for a root or a
/// parent not among them). Roots keep their order, as do siblings, so the
/// result is deterministic. Items on a cycle (which parent links of hashes
/// cannot form) come last. O(n).
pub fn preorder(up: &[Option<usize>]) -> Vec<usize> {
    let n = up.len();
    // Children as one flat list (compressed rows), each node's children in
    // their original order.
    let mut start = vec![0usize; n + 1];
    for &p in up.iter().flatten() {
        start[p + 1] += 1;
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut kids = vec![0usize; start[n]];
    for (i, p) in up.iter().enumerate() {
        if let Some(p) = *p {
            kids[fill[p]] = i;
            fill[p] += 1;
        }
    }
    let mut order = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    let mut stack = Vec::new();
    for root in (0..n).filter(|&i| up[i].is_none()) {
        stack.push(root);
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            order.push(i);
            // Reversed onto the stack so the first child is visited first.
            stack.extend(kids[start[i]..start[i + 1]].iter().rev());
        }
    }
    order.extend((0..n).filter(|&i| !seen[i]));
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn chains_come_root_first_and_contiguous() {
        // Two chains planned leaf first and interleaved: 0 <- 2 <- 4 and
        // 1 <- 3 <- 5, listed as [4, 5, 2, 3, 0, 1].
        let up = [Some(2), Some(3), Some(4), Some(5), None, None];
        assert_eq!(preorder(&up), vec![4, 2, 0, 5, 3, 1]);
    }

    proptest! {
        #[test]
        fn a_permutation_with_parents_first(parents in proptest::collection::vec(proptest::option::of(0usize..40), 0..40)) {
            // Only links to earlier items: a forest.
            let up: Vec<Option<usize>> = parents
                .iter()
                .enumerate()
                .map(|(i, p)| p.filter(|&p| p < i))
                .collect();
            let order = preorder(&up);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..up.len()).collect::<Vec<_>>());
            let mut at = vec![0; up.len()];
            for (k, &i) in order.iter().enumerate() {
                at[i] = k;
            }
            for (i, p) in up.iter().enumerate() {
                if let Some(p) = p {
                    prop_assert!(at[*p] < at[i]);
                }
            }
        }
    }
}
