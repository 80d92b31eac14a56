/// SHA-512/256 (FIPS 180-4 §5.3.6.2, §6.7), the hash of Digest's `SHA-512-256` algorithm
/// (RFC 7616 §3.2).
///
/// swift-crypto has no SHA-512/256, and it is not SHA-512 cut to 32 bytes: it runs the SHA-512
/// compression function from its own initial hash value, then keeps the first 256 bits.
/// (RFC 7616's own §3.9.2 example was computed with truncated SHA-512; see the tests.)
///
/// Incremental, so that an `auth-int` body can be hashed while it streams. A value type: copy it
/// to hash a common prefix two ways.
package struct SHA512_256: Sendable {
    /// The digest length in bytes.
    package static let byteCount = 32

    /// H(0) for SHA-512/t with t = 256 (FIPS 180-4 §5.3.6.2).
    private static let initialHash: [UInt64] = [
        0x2231_2194_FC2B_F72C, 0x9F55_5FA3_C84C_64C2, 0x2393_B86B_6F53_B151, 0x9638_7719_5940_EABD,
        0x9628_3EE2_A88E_FFE3, 0xBE5E_1E25_5386_3992, 0x2B01_99FC_2C85_B8AA, 0x0EB7_2DDC_81C5_2CA2,
    ]

    /// The SHA-512 round constants K (FIPS 180-4 §4.2.3).
    private static let k: [UInt64] = [
        0x428A_2F98_D728_AE22, 0x7137_4491_23EF_65CD, 0xB5C0_FBCF_EC4D_3B2F, 0xE9B5_DBA5_8189_DBBC,
        0x3956_C25B_F348_B538, 0x59F1_11F1_B605_D019, 0x923F_82A4_AF19_4F9B, 0xAB1C_5ED5_DA6D_8118,
        0xD807_AA98_A303_0242, 0x1283_5B01_4570_6FBE, 0x2431_85BE_4EE4_B28C, 0x550C_7DC3_D5FF_B4E2,
        0x72BE_5D74_F27B_896F, 0x80DE_B1FE_3B16_96B1, 0x9BDC_06A7_25C7_1235, 0xC19B_F174_CF69_2694,
        0xE49B_69C1_9EF1_4AD2, 0xEFBE_4786_384F_25E3, 0x0FC1_9DC6_8B8C_D5B5, 0x240C_A1CC_77AC_9C65,
        0x2DE9_2C6F_592B_0275, 0x4A74_84AA_6EA6_E483, 0x5CB0_A9DC_BD41_FBD4, 0x76F9_88DA_8311_53B5,
        0x983E_5152_EE66_DFAB, 0xA831_C66D_2DB4_3210, 0xB003_27C8_98FB_213F, 0xBF59_7FC7_BEEF_0EE4,
        0xC6E0_0BF3_3DA8_8FC2, 0xD5A7_9147_930A_A725, 0x06CA_6351_E003_826F, 0x1429_2967_0A0E_6E70,
        0x27B7_0A85_46D2_2FFC, 0x2E1B_2138_5C26_C926, 0x4D2C_6DFC_5AC4_2AED, 0x5338_0D13_9D95_B3DF,
        0x650A_7354_8BAF_63DE, 0x766A_0ABB_3C77_B2A8, 0x81C2_C92E_47ED_AEE6, 0x9272_2C85_1482_353B,
        0xA2BF_E8A1_4CF1_0364, 0xA81A_664B_BC42_3001, 0xC24B_8B70_D0F8_9791, 0xC76C_51A3_0654_BE30,
        0xD192_E819_D6EF_5218, 0xD699_0624_5565_A910, 0xF40E_3585_5771_202A, 0x106A_A070_32BB_D1B8,
        0x19A4_C116_B8D2_D0C8, 0x1E37_6C08_5141_AB53, 0x2748_774C_DF8E_EB99, 0x34B0_BCB5_E19B_48A8,
        0x391C_0CB3_C5C9_5A63, 0x4ED8_AA4A_E341_8ACB, 0x5B9C_CA4F_7763_E373, 0x682E_6FF3_D6B2_B8A3,
        0x748F_82EE_5DEF_B2FC, 0x78A5_636F_4317_2F60, 0x84C8_7814_A1F0_AB72, 0x8CC7_0208_1A64_39EC,
        0x90BE_FFFA_2363_1E28, 0xA450_6CEB_DE82_BDE9, 0xBEF9_A3F7_B2C6_7915, 0xC671_78F2_E372_532B,
        0xCA27_3ECE_EA26_619C, 0xD186_B8C7_21C0_C207, 0xEADA_7DD6_CDE0_EB1E, 0xF57D_4F7F_EE6E_D178,
        0x06F0_67AA_7217_6FBA, 0x0A63_7DC5_A2C8_98A6, 0x113F_9804_BEF9_0DAE, 0x1B71_0B35_131C_471B,
        0x28DB_77F5_2304_7D84, 0x32CA_AB7B_40C7_2493, 0x3C9E_BE0A_15C9_BEBC, 0x431D_67C4_9C10_0D4C,
        0x4CC5_D4BE_CB3E_42B6, 0x597F_299C_FC65_7E2A, 0x5FCB_6FAB_3AD6_FAEC, 0x6C44_198C_4A47_5817,
    ]

    private var state: [UInt64] = SHA512_256.initialHash
    /// Bytes waiting for a full 128-byte block.
    private var buffer: [UInt8] = []
    /// Message length in bytes so far. 2^64 bytes is beyond any body the broker buffers.
    private var length: UInt64 = 0

    package init() {
        buffer.reserveCapacity(128)
    }

    /// The digest of `bytes` in one call.
    package static func hash(_ bytes: some Sequence<UInt8>) -> [UInt8] {
        var hasher = SHA512_256()
        hasher.update(bytes)
        return hasher.finalize()
    }

    package mutating func update(_ bytes: some Sequence<UInt8>) {
        let input = Array(bytes)
        length &+= UInt64(input.count)
        var offset = 0
        if !buffer.isEmpty {
            let take = min(128 - buffer.count, input.count)
            buffer.append(contentsOf: input[0..<take])
            offset = take
            guard buffer.count == 128 else { return }
            Self.compress(&state, buffer)
            buffer.removeAll(keepingCapacity: true)
        }
        while input.count - offset >= 128 {
            Self.compress(&state, input[offset..<(offset + 128)])
            offset += 128
        }
        buffer.append(contentsOf: input[offset...])
    }

    /// The 32-byte digest. Non-mutating, so a hasher can keep going after a peek.
    package func finalize() -> [UInt8] {
        var state = self.state
        var block = buffer
        block.append(0x80)
        // Pad to 112 mod 128, then the 128-bit big-endian bit length (FIPS 180-4 §5.1.2).
        while block.count % 128 != 112 { block.append(0) }
        let bitLength = length &* 8
        let highBits = length >> 61
        for shift in stride(from: 56, through: 0, by: -8) { block.append(UInt8(truncatingIfNeeded: highBits >> UInt64(shift))) }
        for shift in stride(from: 56, through: 0, by: -8) { block.append(UInt8(truncatingIfNeeded: bitLength >> UInt64(shift))) }
        var offset = 0
        while offset < block.count {
            Self.compress(&state, block[offset..<(offset + 128)])
            offset += 128
        }
        var digest: [UInt8] = []
        digest.reserveCapacity(Self.byteCount)
        for word in state.prefix(4) {
            for shift in stride(from: 56, through: 0, by: -8) { digest.append(UInt8(truncatingIfNeeded: word >> UInt64(shift))) }
        }
        return digest
    }

    /// The SHA-512 compression function on one 128-byte block (FIPS 180-4 §6.4.2).
    private static func compress(_ state: inout [UInt64], _ block: some RandomAccessCollection<UInt8>) {
        var w = [UInt64](repeating: 0, count: 80)
        var index = block.startIndex
        for t in 0..<16 {
            var word: UInt64 = 0
            for _ in 0..<8 {
                word = word << 8 | UInt64(block[index])
                index = block.index(after: index)
            }
            w[t] = word
        }
        for t in 16..<80 {
            let s0 = rotr(w[t - 15], 1) ^ rotr(w[t - 15], 8) ^ (w[t - 15] >> 7)
            let s1 = rotr(w[t - 2], 19) ^ rotr(w[t - 2], 61) ^ (w[t - 2] >> 6)
            w[t] = w[t - 16] &+ s0 &+ w[t - 7] &+ s1
        }
        var a = state[0], b = state[1], c = state[2], d = state[3]
        var e = state[4], f = state[5], g = state[6], h = state[7]
        for t in 0..<80 {
            let sum1 = rotr(e, 14) ^ rotr(e, 18) ^ rotr(e, 41)
            let choose = (e & f) ^ (~e & g)
            let t1 = h &+ sum1 &+ choose &+ k[t] &+ w[t]
            let sum0 = rotr(a, 28) ^ rotr(a, 34) ^ rotr(a, 39)
            let majority = (a & b) ^ (a & c) ^ (b & c)
            let t2 = sum0 &+ majority
            h = g
            g = f
            f = e
            e = d &+ t1
            d = c
            c = b
            b = a
            a = t1 &+ t2
        }
        state[0] &+= a
        state[1] &+= b
        state[2] &+= c
        state[3] &+= d
        state[4] &+= e
        state[5] &+= f
        state[6] &+= g
        state[7] &+= h
    }

    private static func rotr(_ x: UInt64, _ n: UInt64) -> UInt64 { (x >> n) | (x << (64 - n)) }
}
