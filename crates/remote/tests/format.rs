//! The object header: encode/decode round trips, and any single-byte change
//! of an encoded header is refused.

use kvtier_core::{BlockHash, BlockSums};
use kvtier_remote::format::{Header, header_len};
use proptest::prelude::*;

fn header() -> impl Strategy<Value = Header> {
    (
        any::<u128>(),
        1u64..(1 << 32),
        proptest::collection::vec(any::<u64>(), 1..64),
        any::<u64>(),
    )
        .prop_map(|(key, layer_bytes, layers, block)| Header {
            key: BlockHash(key),
            block_bytes: layer_bytes * layers.len() as u64,
            layer_bytes,
            sums: BlockSums { block, layers },
        })
}

proptest! {
    #[test]
    fn headers_round_trip(h in header(), tail in proptest::collection::vec(any::<u8>(), 0..16)) {
        let mut b = h.encode();
        prop_assert_eq!(b.len(), header_len(h.sums.layers.len() as u32));
        // Data after the header does not disturb decoding.
        b.extend_from_slice(&tail);
        prop_assert_eq!(Header::decode(&b), Ok(h));
    }

    #[test]
    fn any_single_byte_change_is_refused(h in header(), at in any::<prop::sample::Index>(), x in 1u8..=255) {
        let mut b = h.encode();
        let i = at.index(b.len());
        b[i] ^= x;
        prop_assert!(Header::decode(&b).is_err(), "byte {} ^ {:#x} accepted", i, x);
    }

    #[test]
    fn any_truncation_is_refused(h in header(), at in any::<prop::sample::Index>()) {
        let b = h.encode();
        let n = at.index(b.len());
        prop_assert!(Header::decode(&b[..n]).is_err());
    }
}
