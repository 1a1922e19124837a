//! Authenticated node locations (docs/meta-api.md §10.2): a published
//! block's URI parses back to what was published, with and without the
//! cluster fields, and its MAC checks out for exactly the fields it was
//! made for: any single changed field fails it.

use std::net::SocketAddr;

use kvtier_backend::location::{Located, verify_mac};
use kvtier_backend::{ClusterNode, LocationKey, PublishedBlock};
use proptest::prelude::*;

/// A located block and the node that publishes it.
#[derive(Debug, Clone)]
struct Case {
    namespace: u128,
    client: u128,
    stored: u128,
    sum: u64,
    node: String,
    peer: SocketAddr,
    instance: String,
    spec: String,
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<u128>(),
        any::<u128>(),
        any::<u128>(),
        any::<u64>(),
        "[a-z][a-z0-9-]{0,12}",
        // As addresses are configured: no IPv6 flow label or scope, which
        // an address's text form does not carry.
        (any::<std::net::IpAddr>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::new(ip, port)),
        "[a-zA-Z0-9 /._-]{1,16}",
        0u32..8,
    )
        .prop_map(
            |(namespace, client, stored, sum, node, peer, instance, rank)| Case {
                namespace,
                client,
                stored,
                sum,
                node,
                peer,
                instance,
                spec: format!("tp{rank}"),
            },
        )
}

fn located(c: &Case) -> Located<'_> {
    Located {
        namespace: c.namespace,
        client: c.client,
        stored: c.stored,
        sum: c.sum,
        node: &c.node,
        peer: c.peer,
    }
}

proptest! {
    #[test]
    fn uris_round_trip_and_macs_bind_every_field(c in case(), secret in any::<[u8; 32]>(), which in 0usize..7, flip in 1u128..) {
        let key = LocationKey::from_secret(&secret);
        let signer = ClusterNode { node: c.node.clone(), addr: c.peer, key: key.clone() };
        let fields = signer.sign(c.namespace, c.client, c.stored, c.sum);
        let block = PublishedBlock {
            instance: c.instance.clone(),
            spec: c.spec.clone(),
            client_key: c.client,
            stored: c.stored,
            peer: Some(fields),
        };
        let uri = block.uri(&c.node).unwrap();
        let (node, parsed) = PublishedBlock::parse_any(&uri).expect("parses");
        prop_assert_eq!(&node, &c.node);
        prop_assert_eq!(&parsed, &block);
        prop_assert_eq!(PublishedBlock::parse(&c.node, &uri), Some(block.clone()));
        prop_assert!(verify_mac(&key, &located(&c), &fields.mac));

        // Without the cluster fields, as a node without `[peer]` publishes.
        let plain = PublishedBlock { peer: None, ..block };
        let uri = plain.uri(&c.node).unwrap();
        prop_assert_eq!(PublishedBlock::parse_any(&uri), Some((c.node.clone(), plain)));

        // One field changed: the MAC no longer checks out.
        let mut m = c.clone();
        match which {
            0 => m.namespace ^= flip,
            1 => m.client ^= flip,
            2 => m.stored ^= flip,
            3 => m.sum ^= flip as u64 | 1,
            4 => m.node.push('x'),
            5 => m.peer.set_port(m.peer.port().wrapping_add(1)),
            _ => {
                let other = LocationKey::from_secret(&secret.map(|b| b ^ 1));
                prop_assert!(!verify_mac(&other, &located(&c), &fields.mac));
                return Ok(());
            }
        }
        prop_assert!(!verify_mac(&key, &located(&m), &fields.mac));
    }

    /// A tampered query (a field missing, extra, or not hex) does not parse
    /// as a published block.
    #[test]
    fn malformed_cluster_fields_do_not_parse(c in case(), cut in 0usize..3) {
        let key = LocationKey::from_secret(&[1; 32]);
        let signer = ClusterNode { node: c.node.clone(), addr: c.peer, key };
        let block = PublishedBlock {
            instance: c.instance.clone(),
            spec: c.spec.clone(),
            client_key: c.client,
            stored: c.stored,
            peer: Some(signer.sign(c.namespace, c.client, c.stored, c.sum)),
        };
        let uri = block.uri(&c.node).unwrap();
        let (base, query) = uri.split_once('?').unwrap();
        let mut items: Vec<&str> = query.split('&').collect();
        items.remove(cut);
        let missing = format!("{base}?{}", items.join("&"));
        prop_assert_eq!(PublishedBlock::parse_any(&missing), None);
        let extra = format!("{uri}&x=1");
        prop_assert_eq!(PublishedBlock::parse_any(&extra), None);
        let short_mac = &uri[..uri.len() - 1];
        prop_assert_eq!(PublishedBlock::parse_any(short_mac), None);
    }
}
