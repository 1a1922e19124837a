//! XXH3-64 with a seed, with the long-input loop chosen at run time: on
//! x86-64 with AVX2 the stripes go through 256-bit registers, elsewhere
//! through a portable 64-bit version of the same loop. `xxhash_rust` picks
//! its kernel when it is compiled, which for a portable build is SSE2: about
//! half the speed on the blocks every read verifies.
//!
//! Two entry points: [`hash`] over bytes in place, and [`copy_and_hash`],
//! which hashes a buffer *while copying it*: one pass that loads each
//! 64-byte stripe of the source once, stores it to the destination and feeds
//! the same registers to the hash. A separate copy followed by a hash costs
//! a second pass over the data, which for blocks streamed from DRAM is what
//! keeps a verified copy well below memcpy speed.
//!
//! Both equal `xxhash_rust::xxh3::xxh3_64_with_seed` (the tests check them
//! against that crate for every length class). Inputs up to 240 bytes take
//! XXH3's short paths, in `xxhash_rust`.
//!
//! The algorithm (XXH3 "hashLong" with a seed), for reference:
//!
//! ```text
//! secret  = kSecret with 64-bit words (le) at 16i += seed, at 16i+8 -= seed
//! acc     = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1]
//! stripe(acc, p, s): for j in 0..8: v = le64(p+8j); k = v ^ le64(s+8j);
//!                    acc[j^1] += v; acc[j] += lo32(k) * hi32(k)
//! per 1024-byte block: 16 stripes with s = secret + 8 * stripe, then
//!                      scramble: acc[j] = (acc[j] ^ acc[j] >> 47 ^ le64(secret+128+8j)) * P32_1
//! then the remaining whole stripes of the (len - 1) prefix, then the last
//! 64 bytes of the input with s = secret + 121; finally
//! avalanche(len * P64_1 + sum over i<4 of fold(acc[2i] ^ le64(secret+11+16i), acc[2i+1] ^ le64(secret+19+16i)))
//! ```

const STRIPE: usize = 64;
const SECRET_LEN: usize = 192;
const STRIPES_PER_BLOCK: usize = (SECRET_LEN - STRIPE) / 8;
const BLOCK_LEN: usize = STRIPE * STRIPES_PER_BLOCK;
const SCRAMBLE_AT: usize = SECRET_LEN - STRIPE;
const LAST_STRIPE_AT: usize = SECRET_LEN - STRIPE - 7;
const MERGE_AT: usize = 11;
/// Inputs up to this length take XXH3's short paths (not fused).
const MID_SIZE_MAX: usize = 240;

const P32_1: u64 = 0x9E37_79B1;
const P32_2: u64 = 0x85EB_CA77;
const P32_3: u64 = 0xC2B2_AE3D;
const P64_1: u64 = 0x9E37_79B1_85EB_CA87;
const P64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P64_3: u64 = 0x1656_67B1_9E37_79F9;
const P64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const P64_5: u64 = 0x27D4_EB2F_1656_67C5;

/// XXH3's default secret, `kSecret`, as published in the XXH3 specification.
const K_SECRET: [u8; SECRET_LEN] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

type Acc = [u64; 8];

fn le64(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The secret XXH3 derives from `seed`.
fn seeded_secret(seed: u64) -> [u8; SECRET_LEN] {
    let mut s = K_SECRET;
    for i in 0..SECRET_LEN / 16 {
        let lo = le64(&K_SECRET, 16 * i).wrapping_add(seed);
        let hi = le64(&K_SECRET, 16 * i + 8).wrapping_sub(seed);
        s[16 * i..16 * i + 8].copy_from_slice(&lo.to_le_bytes());
        s[16 * i + 8..16 * i + 16].copy_from_slice(&hi.to_le_bytes());
    }
    s
}

fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

fn fold(a: u64, b: u64) -> u64 {
    let p = a as u128 * b as u128;
    (p as u64) ^ ((p >> 64) as u64)
}

fn merge(acc: &Acc, secret: &[u8; SECRET_LEN], len: usize) -> u64 {
    let mut h = (len as u64).wrapping_mul(P64_1);
    for i in 0..4 {
        let s = MERGE_AT + 16 * i;
        h = h.wrapping_add(fold(
            acc[2 * i] ^ le64(secret, s),
            acc[2 * i + 1] ^ le64(secret, s + 8),
        ));
    }
    avalanche(h)
}

/// `xxh3_64_with_seed(bytes, seed)`.
pub(crate) fn hash(bytes: &[u8], seed: u64) -> u64 {
    let len = bytes.len();
    if len <= MID_SIZE_MAX {
        return xxhash_rust::xxh3::xxh3_64_with_seed(bytes, seed);
    }
    let secret = seeded_secret(seed);
    let mut acc: Acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F is present; `len > 240`.
            unsafe { avx512::hash_long(&mut acc, bytes, &secret) };
            return merge(&acc, &secret, len);
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present; `len > 240`.
            unsafe { avx2::hash_long(&mut acc, bytes, &secret) };
            return merge(&acc, &secret, len);
        }
    }
    portable::hash_long(&mut acc, bytes, &secret);
    merge(&acc, &secret, len)
}

/// Copies `src[..dst.len()]` into `dst` and returns `xxh3_64_with_seed(dst, seed)`.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes and not overlap
/// `dst`. If another thread or process writes the source meanwhile, the
/// returned hash is still the hash of what ended up in `dst`.
pub(crate) unsafe fn copy_and_hash(src: *const u8, dst: &mut [u8], seed: u64) -> u64 {
    let len = dst.len();
    if len <= MID_SIZE_MAX {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), len) };
        return xxhash_rust::xxh3::xxh3_64_with_seed(dst, seed);
    }
    let secret = seeded_secret(seed);
    let mut acc: Acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F is present; the caller's contract covers the
            // pointers; `len > 240`.
            unsafe { avx512::copy_long(&mut acc, src, dst, &secret) };
            return merge(&acc, &secret, len);
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present; the caller's contract covers the
            // pointers; `len > 240`.
            unsafe { avx2::copy_long(&mut acc, src, dst, &secret) };
            return merge(&acc, &secret, len);
        }
    }
    // SAFETY: the caller's contract; `len > 240`.
    unsafe { portable::copy_long(&mut acc, src, dst, &secret) };
    merge(&acc, &secret, len)
}

/// The stripe loop shared by both kernels: `stripe_copy(acc, src, dst,
/// secret_offset)` copies and accumulates one 64-byte stripe,
/// `stripe(acc, bytes, secret_offset)` accumulates one without copying,
/// `scramble(acc)` ends a block.
macro_rules! long_loop {
    ($acc:expr, $src:expr, $dst:expr, $secret:expr, $stripe_copy:ident, $stripe:ident, $scramble:ident) => {{
        let acc = $acc;
        let src: *const u8 = $src;
        let dst: &mut [u8] = $dst;
        let secret: &[u8; SECRET_LEN] = $secret;
        let len = dst.len();
        let out = dst.as_mut_ptr();
        let blocks = (len - 1) / BLOCK_LEN;
        for b in 0..blocks {
            for s in 0..STRIPES_PER_BLOCK {
                let at = b * BLOCK_LEN + s * STRIPE;
                $stripe_copy(acc, src.add(at), out.add(at), secret, s * 8);
            }
            $scramble(acc, secret);
        }
        let stripes = ((len - 1) - blocks * BLOCK_LEN) / STRIPE;
        for s in 0..stripes {
            let at = blocks * BLOCK_LEN + s * STRIPE;
            $stripe_copy(acc, src.add(at), out.add(at), secret, s * 8);
        }
        // The bytes after the last whole stripe (1 to 64 of them), then the
        // input's last 64 bytes again, from the destination.
        let copied = blocks * BLOCK_LEN + stripes * STRIPE;
        std::ptr::copy_nonoverlapping(src.add(copied), out.add(copied), len - copied);
        $stripe(acc, out.add(len - STRIPE), secret, LAST_STRIPE_AT);
    }};
}

/// The stripe loop over bytes in place: `stripe(acc, bytes, secret_offset)`
/// accumulates one 64-byte stripe, `scramble(acc)` ends a block.
macro_rules! hash_loop {
    ($acc:expr, $bytes:expr, $secret:expr, $stripe:ident, $scramble:ident) => {{
        let acc = $acc;
        let bytes: &[u8] = $bytes;
        let secret: &[u8; SECRET_LEN] = $secret;
        let len = bytes.len();
        let p = bytes.as_ptr();
        let blocks = (len - 1) / BLOCK_LEN;
        for b in 0..blocks {
            for s in 0..STRIPES_PER_BLOCK {
                $stripe(acc, p.add(b * BLOCK_LEN + s * STRIPE), secret, s * 8);
            }
            $scramble(acc, secret);
        }
        let stripes = ((len - 1) - blocks * BLOCK_LEN) / STRIPE;
        for s in 0..stripes {
            $stripe(acc, p.add(blocks * BLOCK_LEN + s * STRIPE), secret, s * 8);
        }
        $stripe(acc, p.add(len - STRIPE), secret, LAST_STRIPE_AT);
    }};
}

mod portable {
    use super::*;

    /// # Safety
    /// `src` readable and `dst` writable for 64 bytes.
    #[inline(always)]
    unsafe fn stripe_copy(
        acc: &mut Acc,
        src: *const u8,
        dst: *mut u8,
        secret: &[u8; SECRET_LEN],
        at: usize,
    ) {
        for j in 0..8 {
            // SAFETY: j * 8 + 8 <= 64, within the caller's stripe.
            let v = unsafe { src.add(8 * j).cast::<u64>().read_unaligned() };
            // SAFETY: as above, for the destination stripe.
            unsafe { dst.add(8 * j).cast::<u64>().write_unaligned(v) };
            let v = u64::from_le(v);
            let k = v ^ le64(secret, at + 8 * j);
            acc[j ^ 1] = acc[j ^ 1].wrapping_add(v);
            acc[j] = acc[j].wrapping_add((k & 0xFFFF_FFFF).wrapping_mul(k >> 32));
        }
    }

    /// # Safety
    /// `p` readable for 64 bytes.
    #[inline(always)]
    unsafe fn stripe(acc: &mut Acc, p: *const u8, secret: &[u8; SECRET_LEN], at: usize) {
        for j in 0..8 {
            // SAFETY: within the caller's stripe.
            let v = u64::from_le(unsafe { p.add(8 * j).cast::<u64>().read_unaligned() });
            let k = v ^ le64(secret, at + 8 * j);
            acc[j ^ 1] = acc[j ^ 1].wrapping_add(v);
            acc[j] = acc[j].wrapping_add((k & 0xFFFF_FFFF).wrapping_mul(k >> 32));
        }
    }

    #[inline(always)]
    fn scramble(acc: &mut Acc, secret: &[u8; SECRET_LEN]) {
        for (j, a) in acc.iter_mut().enumerate() {
            let x = *a ^ (*a >> 47) ^ le64(secret, SCRAMBLE_AT + 8 * j);
            *a = x.wrapping_mul(P32_1);
        }
    }

    /// # Safety
    /// As [`copy_and_hash`], with `dst.len() > 240`.
    pub(super) unsafe fn copy_long(
        acc: &mut Acc,
        src: *const u8,
        dst: &mut [u8],
        secret: &[u8; SECRET_LEN],
    ) {
        // SAFETY: every offset the loop touches is below dst.len(), which the
        // caller guarantees readable at `src` and writable at `dst`.
        unsafe { long_loop!(acc, src, dst, secret, stripe_copy, stripe, scramble) }
    }

    /// `bytes.len() > 240`.
    pub(super) fn hash_long(acc: &mut Acc, bytes: &[u8], secret: &[u8; SECRET_LEN]) {
        // SAFETY: every stripe the loop reads ends at or before bytes.len()
        // (the last one is the input's final 64 bytes, and len > 240).
        unsafe { hash_loop!(acc, bytes, secret, stripe, scramble) }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// How far ahead of the stripe being copied the source is prefetched.
    const PREFETCH: usize = 1024;

    /// The accumulators as two 256-bit vectors.
    type Vacc = [__m256i; 2];

    /// # Safety
    /// AVX2 available; `src` readable and `dst` writable for 64 bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn stripe_copy(
        acc: &mut Vacc,
        src: *const u8,
        dst: *mut u8,
        secret: &[u8; SECRET_LEN],
        at: usize,
    ) {
        // Ask for the stripe PREFETCH bytes ahead now, so more cache-line
        // fetches are in flight than the out-of-order window alone issues
        // (the loop's arithmetic fills that window). A prefetch past the end
        // of the source is harmless: it never faults.
        _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(PREFETCH).cast());
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: 32 * i + 32 <= 64 bytes of the caller's stripes; the
            // secret offset at + 32 * i + 32 <= 128 + 64 = SECRET_LEN.
            unsafe {
                let v = _mm256_loadu_si256(src.add(32 * i).cast());
                _mm256_storeu_si256(dst.add(32 * i).cast(), v);
                let k = _mm256_loadu_si256(secret.as_ptr().add(at + 32 * i).cast());
                *a = accumulate(*a, v, k);
            }
        }
    }

    /// # Safety
    /// AVX2 available; `p` readable for 64 bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn stripe(acc: &mut Vacc, p: *const u8, secret: &[u8; SECRET_LEN], at: usize) {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: within the caller's stripe and the secret (at <= 121).
            unsafe {
                let v = _mm256_loadu_si256(p.add(32 * i).cast());
                let k = _mm256_loadu_si256(secret.as_ptr().add(at + 32 * i).cast());
                *a = accumulate(*a, v, k);
            }
        }
    }

    /// `acc[j ^ 1] += v[j]; acc[j] += lo32(k[j]) * hi32(k[j])` with `k = v ^ key`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn accumulate(acc: __m256i, v: __m256i, key: __m256i) -> __m256i {
        let k = _mm256_xor_si256(v, key);
        let k_hi = _mm256_shuffle_epi32::<0x31>(k);
        let product = _mm256_mul_epu32(k, k_hi);
        let swapped = _mm256_shuffle_epi32::<0x4E>(v);
        _mm256_add_epi64(product, _mm256_add_epi64(acc, swapped))
    }

    /// `acc[j] = (acc[j] ^ acc[j] >> 47 ^ key[j]) * P32_1`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn scramble(acc: &mut Vacc, secret: &[u8; SECRET_LEN]) {
        let prime = _mm256_set1_epi32(P32_1 as i32);
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: a 32-byte load at SCRAMBLE_AT + 32 * i, which ends at
            // most at SECRET_LEN.
            let key =
                unsafe { _mm256_loadu_si256(secret.as_ptr().add(SCRAMBLE_AT + 32 * i).cast()) };
            let x = _mm256_xor_si256(_mm256_xor_si256(*a, _mm256_srli_epi64::<47>(*a)), key);
            let lo = _mm256_mul_epu32(x, prime);
            let hi = _mm256_mul_epu32(_mm256_shuffle_epi32::<0x31>(x), prime);
            *a = _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(hi));
        }
    }

    /// # Safety
    /// AVX2 available; as [`copy_and_hash`], with `dst.len() > 240`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy_long(
        acc: &mut Acc,
        src: *const u8,
        dst: &mut [u8],
        secret: &[u8; SECRET_LEN],
    ) {
        // SAFETY: AVX2 is enabled for this function; `Acc` is 64 bytes, two
        // unaligned 256-bit loads/stores cover it; every offset the loop
        // touches is below dst.len().
        unsafe {
            let p = acc.as_mut_ptr().cast::<__m256i>();
            let mut v: Vacc = [_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1))];
            let vacc = &mut v;
            long_loop!(vacc, src, dst, secret, stripe_copy, stripe, scramble);
            _mm256_storeu_si256(p, v[0]);
            _mm256_storeu_si256(p.add(1), v[1]);
        }
    }

    /// Prefetches ahead, as [`stripe_copy`] does, then accumulates.
    ///
    /// # Safety
    /// AVX2 available; `p` readable for 64 bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn stripe_ahead(acc: &mut Vacc, p: *const u8, secret: &[u8; SECRET_LEN], at: usize) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH).cast());
        // SAFETY: the caller's contract.
        unsafe { stripe(acc, p, secret, at) }
    }

    /// # Safety
    /// AVX2 available; `bytes.len() > 240`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn hash_long(acc: &mut Acc, bytes: &[u8], secret: &[u8; SECRET_LEN]) {
        // SAFETY: as in `copy_long`; every stripe read ends at or before
        // bytes.len().
        unsafe {
            let p = acc.as_mut_ptr().cast::<__m256i>();
            let mut v: Vacc = [_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1))];
            let vacc = &mut v;
            hash_loop!(vacc, bytes, secret, stripe_ahead, scramble);
            _mm256_storeu_si256(p, v[0]);
            _mm256_storeu_si256(p.add(1), v[1]);
        }
    }
}

/// The AVX2 kernels' loop with one 512-bit register per stripe.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// How far ahead of the stripe being read the source is prefetched.
    const PREFETCH: usize = 1024;

    /// Copies at least this long, to a 64-byte aligned destination, store
    /// with non-temporal stores.
    const STREAM_MIN: usize = 16 << 10;

    /// Loads one stripe and accumulates it; returns it for the copy to
    /// store, so the bytes hashed are the bytes stored.
    ///
    /// # Safety
    /// AVX-512F available; `p` readable for 64 bytes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn stripe(
        acc: &mut __m512i,
        p: *const u8,
        secret: &[u8; SECRET_LEN],
        at: usize,
    ) -> __m512i {
        // SAFETY: within the caller's stripe and the secret (at <= 128).
        unsafe {
            let v = _mm512_loadu_si512(p.cast());
            let k = _mm512_loadu_si512(secret.as_ptr().add(at).cast());
            *acc = accumulate(*acc, v, k);
            v
        }
    }

    /// # Safety
    /// AVX-512F available; `src` readable and `dst` writable for 64 bytes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn stripe_copy(
        acc: &mut __m512i,
        src: *const u8,
        dst: *mut u8,
        secret: &[u8; SECRET_LEN],
        at: usize,
    ) {
        _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(PREFETCH).cast());
        // SAFETY: one 64-byte stripe of the caller's buffers; the secret
        // offset at + 64 <= SECRET_LEN.
        unsafe { _mm512_storeu_si512(dst.cast(), stripe(acc, src, secret, at)) }
    }

    /// [`stripe_copy`] with a non-temporal store: the line goes to memory
    /// without being read for ownership first.
    ///
    /// # Safety
    /// AVX-512F available; `src` readable for 64 bytes, `dst` writable for
    /// 64 bytes and 64-byte aligned.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn stripe_copy_nt(
        acc: &mut __m512i,
        src: *const u8,
        dst: *mut u8,
        secret: &[u8; SECRET_LEN],
        at: usize,
    ) {
        _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(PREFETCH).cast());
        // SAFETY: as `stripe_copy`, and `dst` is 64-byte aligned.
        unsafe { _mm512_stream_si512(dst.cast(), stripe(acc, src, secret, at)) }
    }

    /// Orders the non-temporal stores before what follows, then
    /// accumulates: the last stripe is read back from the destination.
    ///
    /// # Safety
    /// AVX-512F available; `p` readable for 64 bytes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn stripe_fenced(acc: &mut __m512i, p: *const u8, secret: &[u8; SECRET_LEN], at: usize) {
        _mm_sfence();
        // SAFETY: the caller's contract.
        unsafe { stripe(acc, p, secret, at) };
    }

    /// Prefetches ahead, then accumulates.
    ///
    /// # Safety
    /// AVX-512F available; `p` readable for 64 bytes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn stripe_ahead(acc: &mut __m512i, p: *const u8, secret: &[u8; SECRET_LEN], at: usize) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH).cast());
        // SAFETY: the caller's contract.
        unsafe { stripe(acc, p, secret, at) };
    }

    /// `acc[j ^ 1] += v[j]; acc[j] += lo32(k[j]) * hi32(k[j])` with `k = v ^ key`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn accumulate(acc: __m512i, v: __m512i, key: __m512i) -> __m512i {
        let k = _mm512_xor_si512(v, key);
        let k_hi = _mm512_shuffle_epi32::<0x31>(k);
        let product = _mm512_mul_epu32(k, k_hi);
        let swapped = _mm512_shuffle_epi32::<0x4E>(v);
        _mm512_add_epi64(product, _mm512_add_epi64(acc, swapped))
    }

    /// `acc[j] = (acc[j] ^ acc[j] >> 47 ^ key[j]) * P32_1`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn scramble(acc: &mut __m512i, secret: &[u8; SECRET_LEN]) {
        let prime = _mm512_set1_epi32(P32_1 as i32);
        // SAFETY: a 64-byte load at SCRAMBLE_AT, which ends at SECRET_LEN.
        let key = unsafe { _mm512_loadu_si512(secret.as_ptr().add(SCRAMBLE_AT).cast()) };
        let a = *acc;
        let x = _mm512_xor_si512(_mm512_xor_si512(a, _mm512_srli_epi64::<47>(a)), key);
        let lo = _mm512_mul_epu32(x, prime);
        let hi = _mm512_mul_epu32(_mm512_shuffle_epi32::<0x31>(x), prime);
        *acc = _mm512_add_epi64(lo, _mm512_slli_epi64::<32>(hi));
    }

    /// # Safety
    /// AVX-512F available; as [`copy_and_hash`], with `dst.len() > 240`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn copy_long(
        acc: &mut Acc,
        src: *const u8,
        dst: &mut [u8],
        secret: &[u8; SECRET_LEN],
    ) {
        // SAFETY: `Acc` is 64 bytes, one unaligned 512-bit load/store covers
        // it; every offset the loop touches is below dst.len().
        unsafe {
            let p = acc.as_mut_ptr().cast::<__m512i>();
            let mut v = _mm512_loadu_si512(p.cast());
            let vacc = &mut v;
            if dst.len() >= STREAM_MIN && dst.as_ptr().align_offset(64) == 0 {
                long_loop!(
                    vacc,
                    src,
                    dst,
                    secret,
                    stripe_copy_nt,
                    stripe_fenced,
                    scramble
                );
            } else {
                long_loop!(vacc, src, dst, secret, stripe_copy, stripe, scramble);
            }
            _mm512_storeu_si512(p.cast(), v);
        }
    }

    /// # Safety
    /// AVX-512F available; `bytes.len() > 240`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn hash_long(acc: &mut Acc, bytes: &[u8], secret: &[u8; SECRET_LEN]) {
        // SAFETY: as in `copy_long`; every stripe read ends at or before
        // bytes.len().
        unsafe {
            let p = acc.as_mut_ptr().cast::<__m512i>();
            let mut v = _mm512_loadu_si512(p.cast());
            let vacc = &mut v;
            hash_loop!(vacc, bytes, secret, stripe_ahead, scramble);
            _mm512_storeu_si512(p.cast(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(len: usize, offset: usize, seed: u64) -> Result<(), TestCaseError> {
        let src: Vec<u8> = (0..len + offset)
            .map(|i| (i as u64).wrapping_mul(0x9E37_79B9) as u8 ^ (i >> 8) as u8)
            .collect();
        let mut dst = vec![0u8; len + 1];
        // SAFETY: src holds len bytes from `offset`; dst is separate.
        let h = unsafe { copy_and_hash(src.as_ptr().add(offset), &mut dst[1..], seed) };
        prop_assert_eq!(&dst[1..], &src[offset..]);
        prop_assert_eq!(
            h,
            xxhash_rust::xxh3::xxh3_64_with_seed(&src[offset..], seed)
        );
        prop_assert_eq!(hash(&src[offset..], seed), h);
        let mut acc: Acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1];
        if len > MID_SIZE_MAX {
            // The portable kernel on its own, even where AVX2 runs above.
            let secret = seeded_secret(seed);
            let mut d2 = vec![0u8; len];
            // SAFETY: as above.
            unsafe { portable::copy_long(&mut acc, src.as_ptr().add(offset), &mut d2, &secret) };
            prop_assert_eq!(merge(&acc, &secret, len), h);
            let mut acc: Acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1];
            portable::hash_long(&mut acc, &src[offset..], &secret);
            prop_assert_eq!(merge(&acc, &secret, len), h);
            // Every SIMD kernel this CPU can run, whichever one `hash` picks.
            #[cfg(target_arch = "x86_64")]
            for (feature, copy, hash) in simd_kernels() {
                if !feature {
                    continue;
                }
                let mut acc: Acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1];
                let mut d3 = vec![0u8; len];
                // SAFETY: the feature is present; as above.
                unsafe { copy(&mut acc, src.as_ptr().add(offset), &mut d3, &secret) };
                prop_assert_eq!(&d3[..], &src[offset..]);
                prop_assert_eq!(merge(&acc, &secret, len), h);
                let mut acc: Acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1];
                // SAFETY: the feature is present; len > 240.
                unsafe { hash(&mut acc, &src[offset..], &secret) };
                prop_assert_eq!(merge(&acc, &secret, len), h);
            }
        }
        Ok(())
    }

    #[cfg(target_arch = "x86_64")]
    type CopyKernel = unsafe fn(&mut Acc, *const u8, &mut [u8], &[u8; SECRET_LEN]);
    #[cfg(target_arch = "x86_64")]
    type HashKernel = unsafe fn(&mut Acc, &[u8], &[u8; SECRET_LEN]);

    /// Each SIMD kernel with whether this CPU can run it.
    #[cfg(target_arch = "x86_64")]
    fn simd_kernels() -> [(bool, CopyKernel, HashKernel); 2] {
        [
            (
                std::arch::is_x86_feature_detected!("avx2"),
                avx2::copy_long,
                avx2::hash_long,
            ),
            (
                std::arch::is_x86_feature_detected!("avx512f"),
                avx512::copy_long,
                avx512::hash_long,
            ),
        ]
    }

    /// Copies long enough for non-temporal stores, to a 64-byte aligned
    /// destination (the AVX-512 kernel streams them) and to a misaligned
    /// one (it does not), from aligned and misaligned sources.
    #[test]
    fn streamed_copies_equal_xxh3() {
        for len in [16 << 10, (16 << 10) + 1, (64 << 10) + 37, 1 << 20, 2 << 20] {
            let src: Vec<u8> = (0..len + 3).map(|i| (i * 131 + i / 977) as u8).collect();
            let mut out = vec![0u8; len + 128];
            let aligned = out.as_ptr().align_offset(64);
            for (from, to) in [(0, aligned), (3, aligned), (3, aligned + 1)] {
                let dst = &mut out[to..to + len];
                dst.fill(0);
                // SAFETY: src holds len bytes from `from`; dst is separate.
                let h = unsafe { copy_and_hash(src.as_ptr().add(from), dst, 9) };
                assert_eq!(&dst[..], &src[from..from + len], "len {len}, {from}->{to}");
                assert_eq!(
                    h,
                    xxhash_rust::xxh3::xxh3_64_with_seed(&src[from..from + len], 9),
                    "len {len}, {from}->{to}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn equals_xxh3_for_any_length_alignment_and_seed(
            len in 0usize..5000,
            offset in 0usize..64,
            seed in any::<u64>(),
        ) {
            check(len, offset, seed)?;
        }
    }

    #[test]
    fn equals_xxh3_at_block_boundaries() {
        for len in [
            241,
            1023,
            1024,
            1025,
            1088,
            2048,
            2049,
            65536,
            65537,
            1 << 20,
        ] {
            for seed in [0, 1, u64::MAX] {
                check(len, 3, seed).unwrap();
            }
        }
    }
}
