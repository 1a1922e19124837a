//! Random traces in the Mooncake format, for the agreement test and for
//! sweeps beyond the shared traces.
//!
//! A trace holds conversations that open on one of four shared system
//! prompts and grow turn by turn, interleaved at random, among one-off
//! prompts; requests arrive two seconds apart at most (one on average).
//! The generator is a fixed xorshift seeded by `seed`, so a seed names one
//! trace on every machine: `kvtier trace random --seed 1` writes the same
//! lines the agreement test replays.

use std::io::{self, Write};

/// Writes `requests` Mooncake JSON lines of the random trace `seed` to `w`.
pub fn write_mooncake<W: Write>(mut w: W, seed: u64, requests: usize) -> io::Result<()> {
    let mut g = Generator::new(seed);
    let mut now = 0u64;
    for _ in 0..requests {
        now += g.below(2000);
        let keys = g.request();
        writeln!(
            w,
            "{{\"timestamp\": {now}, \"input_length\": {}, \"output_length\": 8, \"hash_ids\": {keys:?}}}",
            keys.len() * 512
        )?;
    }
    Ok(())
}

/// The generator's state: the random stream, the next fresh key, the
/// system prompts and the conversations so far.
struct Generator {
    x: u64,
    next_id: u64,
    prompts: Vec<Vec<u64>>,
    sessions: Vec<Vec<u64>>,
}

impl Generator {
    fn new(seed: u64) -> Self {
        let mut g = Generator {
            x: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            next_id: 1_000_000,
            prompts: Vec::new(),
            sessions: Vec::new(),
        };
        g.prompts = (0..4).map(|i| g.fresh(4 + i * 3)).collect();
        g
    }

    /// A number below `n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        self.x % n.max(1)
    }

    /// `n` keys never used before.
    fn fresh(&mut self, n: u64) -> Vec<u64> {
        (0..n)
            .map(|_| {
                self.next_id += 1;
                self.next_id
            })
            .collect()
    }

    /// The keys of the next request: 20% one-off prompts, 20% new
    /// conversations on a system prompt, 60% a conversation's next turn.
    fn request(&mut self) -> Vec<u64> {
        match self.below(10) {
            0..=1 => {
                let n = 1 + self.below(40);
                self.fresh(n)
            }
            2..=3 => {
                let p = self.below(4) as usize;
                let mut s = self.prompts[p].clone();
                let n = 1 + self.below(12);
                s.extend(self.fresh(n));
                self.sessions.push(s.clone());
                s
            }
            _ if !self.sessions.is_empty() => {
                let i = self.below(self.sessions.len() as u64) as usize;
                let n = 1 + self.below(6);
                let grown = self.fresh(n);
                self.sessions[i].extend(grown);
                self.sessions[i].clone()
            }
            _ => self.fresh(8),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{TraceFormat, TraceReader};

    fn lines(seed: u64, requests: usize) -> Vec<u8> {
        let mut out = Vec::new();
        write_mooncake(&mut out, seed, requests).expect("write to a Vec");
        out
    }

    #[test]
    fn a_seed_names_one_trace_that_the_mooncake_reader_reads() {
        assert_eq!(lines(3, 200), lines(3, 200));
        assert_ne!(lines(3, 200), lines(4, 200));
        let reader = TraceReader::from_reader(
            Box::new(std::io::Cursor::new(lines(3, 200))),
            std::path::Path::new("random"),
            None,
        )
        .expect("reader");
        assert_eq!(reader.format(), TraceFormat::Mooncake);
        let reqs: Vec<_> = reader.collect::<Result<_, _>>().expect("valid lines");
        assert_eq!(reqs.len(), 200);
        // Conversations grow: some request extends an earlier one's keys.
        let extends = reqs.iter().enumerate().any(|(i, r)| {
            reqs[..i]
                .iter()
                .any(|p| p.keys.len() < r.keys.len() && r.keys.starts_with(&p.keys))
        });
        assert!(extends, "no conversation grew");
    }
}
