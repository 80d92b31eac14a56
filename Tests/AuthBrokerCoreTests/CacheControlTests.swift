import AuthBrokerCore
import Testing

/// Cache-Control (RFC 9111 §5.2): each directive, the list and argument syntax, duplicates,
/// and inputs built to break the parser.
struct CacheControlTests {
    /// A value with the changes `change` makes to an empty one.
    static func directives(_ change: (inout CacheControl) -> Void) -> CacheControl {
        var value = CacheControl()
        change(&value)
        return value
    }

    @Test(arguments: [
        ("max-age=60", directives { $0.maxAge = .value(60) }),
        ("s-maxage=0", directives { $0.sharedMaxAge = .value(0) }),
        ("no-cache", directives { $0.noCache = true }),
        ("no-store", directives { $0.noStore = true }),
        ("private", directives { $0.isPrivate = true }),
        ("public", directives { $0.isPublic = true }),
        ("must-revalidate", directives { $0.mustRevalidate = true }),
        ("proxy-revalidate", directives { $0.proxyRevalidate = true }),
        ("must-understand", directives { $0.mustUnderstand = true }),
        ("no-transform", directives { $0.noTransform = true }),
        ("immutable", directives { $0.immutable = true }),
        ("stale-while-revalidate=30", directives { $0.staleWhileRevalidate = .value(30) }),
        ("stale-if-error=86400", directives { $0.staleIfError = .value(86_400) }),
        ("max-stale", directives { $0.maxStale = .any }),
        ("max-stale=120", directives { $0.maxStale = .seconds(120) }),
        ("min-fresh=5", directives { $0.minFresh = .value(5) }),
        ("only-if-cached", directives { $0.onlyIfCached = true }),
        ("", CacheControl()),
    ])
    func eachDirective(text: String, expected: CacheControl) {
        #expect(CacheControl(fieldValues: [text]) == expected)
    }

    @Test func aTypicalResponse() {
        let parsed = CacheControl(fieldValues: ["public, max-age=31536000, immutable", "stale-while-revalidate=60"])
        #expect(parsed == Self.directives {
            $0.isPublic = true
            $0.maxAge = .value(31_536_000)
            $0.immutable = true
            $0.staleWhileRevalidate = .value(60)
        })
    }

    @Test(arguments: [
        "MAX-AGE=60, No-Store, PUBLIC", "Max-Age=60,no-store,Public", "  max-age=60 ,\tno-store\t, public  ",
        ",, max-age=60, , ,no-store,public,", "max-age=\"60\", \"no-store\" , public",
    ])
    func namesAnyCaseAndListSyntax(text: String) {
        let parsed = CacheControl(fieldValues: [text])
        if text.contains("\"no-store\"") {
            // A quoted string is not a directive name.
            #expect(parsed == Self.directives {
                $0.maxAge = .value(60)
                $0.isPublic = true
                $0.unknown = ["malformed"]
            })
        } else {
            #expect(parsed == Self.directives {
                $0.maxAge = .value(60)
                $0.noStore = true
                $0.isPublic = true
            })
        }
    }

    @Test func multipleFieldLines() {
        let parsed = CacheControl(fieldValues: ["no-cache", "", "max-age=10, private", " ", "x-custom=\"a, b\""])
        #expect(parsed == Self.directives {
            $0.noCache = true
            $0.maxAge = .value(10)
            $0.isPrivate = true
            $0.unknown = ["x-custom"]
        })
    }

    @Test func aQuoteDoesNotSpanFieldLines() {
        let parsed = CacheControl(fieldValues: ["private=\"a,", "b\", no-store"])
        // The first line's string is unterminated (malformed to its end); the second line reads
        // `b"` as malformed up to its end too, since the quote it opens is never closed.
        #expect(parsed == Self.directives { $0.unknown = ["malformed"] })
    }

    @Test(arguments: [
        ("no-cache=\"Set-Cookie\"", ["set-cookie"]),
        ("no-cache=\"Set-Cookie, X-Secret\"", ["set-cookie", "x-secret"]),
        ("no-cache=\" set-cookie ,,\tAuthorization , \"", ["set-cookie", "authorization"]),
        ("no-cache=Set-Cookie", ["set-cookie"]),
        ("no-cache=\"\"", []),
        ("no-cache=", []),
        ("no-cache=\"a\\,b\"", ["a", "b"]),
    ])
    func qualifiedNoCache(text: String, fields: [String]) {
        #expect(CacheControl(fieldValues: [text]) == Self.directives {
            $0.noCache = true
            $0.noCacheFields = fields
        })
    }

    @Test(arguments: [
        ("private=\"Set-Cookie\"", ["set-cookie"]),
        ("PRIVATE=\"set-cookie, WWW-Authenticate\"", ["set-cookie", "www-authenticate"]),
        ("private=x-a", ["x-a"]),
        ("private=\" , \"", []),
    ])
    func qualifiedPrivate(text: String, fields: [String]) {
        #expect(CacheControl(fieldValues: [text]) == Self.directives {
            $0.isPrivate = true
            $0.privateFields = fields
        })
    }

    @Test(arguments: [
        ("max-age=\"60\"", CacheControl.Seconds.value(60)),
        ("max-age=\"6\\0\"", .value(60)),
        ("max-age=\"\\6\\0\"", .value(60)),
        ("max-age=0060", .value(60)),
        ("max-age=2147483647", .value(2_147_483_647)),
        ("max-age=2147483648", .value(2_147_483_648)),
        ("max-age=2147483649", .value(2_147_483_648)),
        ("max-age=99999999999999999999", .value(2_147_483_648)),
        ("max-age=\(String(repeating: "9", count: 10_000))", .value(2_147_483_648)),
        ("max-age=9223372036854775807", .value(2_147_483_648)),
        ("max-age=18446744073709551616", .value(2_147_483_648)),
        ("max-age", .invalid),
        ("max-age=", .invalid),
        ("max-age=\"\"", .invalid),
        ("max-age=-1", .invalid),
        ("max-age=+1", .invalid),
        ("max-age=1.5", .invalid),
        ("max-age=1e3", .invalid),
        ("max-age=0x10", .invalid),
        ("max-age=\" 60\"", .invalid),
        ("max-age=\"60 \"", .invalid),
        ("max-age=sixty", .invalid),
        ("max-age=\"٦٠\"", .invalid),
    ])
    func deltaSeconds(text: String, value: CacheControl.Seconds) {
        #expect(CacheControl(fieldValues: [text]) == Self.directives { $0.maxAge = value })
    }

    @Test func everySecondsDirectiveClampsAndValidates() {
        let parsed = CacheControl(fieldValues: [
            "s-maxage=99999999999, stale-while-revalidate=x, stale-if-error=\"7\", min-fresh=-3"
        ])
        #expect(parsed == Self.directives {
            $0.sharedMaxAge = .value(2_147_483_648)
            $0.staleWhileRevalidate = .invalid
            $0.staleIfError = .value(7)
            $0.minFresh = .invalid
        })
    }

    @Test(arguments: [
        ("max-stale", CacheControl.MaxStale.any),
        ("max-stale=0", .seconds(0)),
        ("max-stale=\"30\"", .seconds(30)),
        ("max-stale=99999999999999999999", .seconds(2_147_483_648)),
        // Invalid values are read as no staleness at all, the safe reading.
        ("max-stale=", .seconds(0)),
        ("max-stale=-1", .seconds(0)),
        ("max-stale=forever", .seconds(0)),
        ("max-stale=\"\"", .seconds(0)),
    ])
    func maxStale(text: String, value: CacheControl.MaxStale) {
        #expect(CacheControl(fieldValues: [text]) == Self.directives { $0.maxStale = value })
    }

    @Test(arguments: [
        // Same argument again: no conflict.
        (["max-age=60, max-age=60"], directives { $0.maxAge = .value(60) }),
        (["max-age=60", "max-age=\"060\""], directives { $0.maxAge = .value(60) }),
        (["no-store, no-store", "NO-STORE"], directives { $0.noStore = true }),
        (["private=\"a, b\", private=\"A,b \""], directives {
            $0.isPrivate = true
            $0.privateFields = ["a", "b"]
        }),
        // A different one: the first counts, the name is listed once.
        (["max-age=60, max-age=0", "max-age=5"], directives {
            $0.maxAge = .value(60)
            $0.conflicting = ["max-age"]
        }),
        (["max-age=x, max-age=60"], directives {
            $0.maxAge = .invalid
            $0.conflicting = ["max-age"]
        }),
        (["max-stale, max-stale=10"], directives {
            $0.maxStale = .any
            $0.conflicting = ["max-stale"]
        }),
        (["no-cache=\"set-cookie\"", "no-cache"], directives {
            $0.noCache = true
            $0.noCacheFields = ["set-cookie"]
            $0.conflicting = ["no-cache"]
        }),
        (["private, private=\"set-cookie\""], directives {
            $0.isPrivate = true
            $0.conflicting = ["private"]
        }),
        (["public, public=1"], directives {
            $0.isPublic = true
            $0.conflicting = ["public"]
        }),
        (["s-maxage=1, x-ext=a, s-maxage=2, x-ext=b, X-EXT=a"], directives {
            $0.sharedMaxAge = .value(1)
            $0.unknown = ["x-ext"]
            $0.conflicting = ["s-maxage", "x-ext"]
        }),
    ])
    func duplicates(values: [String], expected: CacheControl) {
        #expect(CacheControl(fieldValues: values) == expected)
    }

    @Test func directivesWithoutArgumentsAreHonouredWithOne() {
        let parsed = CacheControl(fieldValues: ["no-store=1, must-revalidate=\"yes\", only-if-cached="])
        #expect(parsed == Self.directives {
            $0.noStore = true
            $0.mustRevalidate = true
            $0.onlyIfCached = true
        })
    }

    @Test func unknownDirectivesAreKept() {
        let parsed = CacheControl(fieldValues: ["X-Foo, community=\"UCI\", x-foo=1, max-age=1, Pre-Check=0"])
        #expect(parsed == Self.directives {
            $0.maxAge = .value(1)
            $0.unknown = ["x-foo", "community", "pre-check"]
            $0.conflicting = ["x-foo"]
        })
    }

    @Test(arguments: [
        // Whitespace around "=" is not in the grammar.
        ("max-age = 60, no-store", directives {
            $0.noStore = true
            $0.unknown = ["malformed"]
        }),
        ("max-age =60, no-store", directives {
            $0.noStore = true
            $0.unknown = ["malformed"]
        }),
        // Text after the argument.
        ("max-age=60 s, no-store", directives {
            $0.noStore = true
            $0.unknown = ["malformed"]
        }),
        ("max-age=\"60\"x, no-store", directives {
            $0.noStore = true
            $0.unknown = ["malformed"]
        }),
        // Not a token: separators, non-ASCII, control characters.
        ("=60, no-store", directives {
            $0.noStore = true
            $0.unknown = ["malformed"]
        }),
        ("(max-age)=60, no-store", directives {
            $0.noStore = true
            $0.unknown = ["malformed"]
        }),
        ("mäx-age=60, no-store", directives {
            $0.noStore = true
            $0.unknown = ["malformed"]
        }),
        ("max-age=6\u{0}0, no-store", directives {
            $0.noStore = true
            $0.unknown = ["malformed"]
        }),
        ("no-\u{7F}store, public", directives {
            $0.isPublic = true
            $0.unknown = ["malformed"]
        }),
        ("max-age=60;x=1, no-store", directives {
            $0.noStore = true
            $0.unknown = ["malformed"]
        }),
        // A comma inside a quoted string does not end a malformed element.
        ("x y=\"a, no-store\", public", directives {
            $0.isPublic = true
            $0.unknown = ["malformed"]
        }),
        // Bad quoted strings: unterminated (to the end), control characters, a dangling escape.
        ("private=\"set-cookie, no-store", directives { $0.unknown = ["malformed"] }),
        ("max-age=\"6\u{1}0\", no-store", directives {
            $0.noStore = true
            $0.unknown = ["malformed"]
        }),
        ("max-age=\"60\\", directives { $0.unknown = ["malformed"] }),
        ("max-age=\"6\\\u{1}0\", public", directives {
            $0.isPublic = true
            $0.unknown = ["malformed"]
        }),
        ("\"", directives { $0.unknown = ["malformed"] }),
        ("\"\"\"", directives { $0.unknown = ["malformed"] }),
        // Several malformed elements are one entry.
        ("@, #=\u{0}, ;, public", directives {
            $0.isPublic = true
            $0.unknown = ["malformed"]
        }),
    ])
    func malformedElementsAreSkipped(text: String, expected: CacheControl) {
        #expect(CacheControl(fieldValues: [text]) == expected)
    }

    /// Quoted-pair and obs-text in an unknown directive's argument: read without harm.
    @Test func quotedArgumentsWithEscapesAndObsText() {
        let parsed = CacheControl(fieldValues: ["x-a=\"q\\\"uote\\\\d, \u{E4}\", no-cache=\"X-\\\"Y\\\"\", public"])
        #expect(parsed == Self.directives {
            $0.unknown = ["x-a"]
            $0.noCache = true
            $0.noCacheFields = ["x-\"y\""]
            $0.isPublic = true
        })
    }

    @Test func longInputs() {
        let many = Array(repeating: "max-age=1", count: 20_000).joined(separator: ",")
        #expect(CacheControl(fieldValues: [many]) == Self.directives { $0.maxAge = .value(1) })
        let commas = String(repeating: ", ", count: 100_000)
        #expect(CacheControl(fieldValues: [commas + "no-store" + commas]) == Self.directives { $0.noStore = true })
        let distinct = (0..<20_000).map { "x-\($0)=\($0)" }.joined(separator: ",")
        #expect(CacheControl(fieldValues: [distinct]).unknown.count == 20_000)
        let longName = String(repeating: "a", count: 100_000)
        #expect(CacheControl(fieldValues: [longName + ", public"]) == Self.directives {
            $0.isPublic = true
            $0.unknown = [longName]
        })
        let unterminated = "private=\"" + String(repeating: "x,", count: 100_000)
        #expect(CacheControl(fieldValues: [unterminated]) == Self.directives { $0.unknown = ["malformed"] })
    }

    /// Random bytes, biased towards the grammar's own characters, and mutations of real values:
    /// every input gives a result, and adding a well-formed line after it never loses that line.
    @Test func hostileInputs() {
        var random = CacheSyntaxRandom(seed: 0xCAC4E)
        let alphabet = Array("max-agenostrpivcu=,\" \\\t0123456789;".utf8) + [0x00, 0x7F, 0xC3, 0xA4, 0xFF]
        let seeds = ["public, max-age=60, no-cache=\"set-cookie, x-a\"", "max-stale=10, private=\"a\\\"b\"", "s-maxage=\"5\""]
        for index in 0..<5000 {
            var bytes: [UInt8]
            switch index % 3 {
            case 0:
                bytes = (0..<Int.random(in: 0...64, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            case 1:
                bytes = (0..<Int.random(in: 0...64, using: &random)).map { _ in alphabet.randomElement(using: &random) ?? 0 }
            default:
                bytes = Array(seeds[index % seeds.count].utf8)
                for _ in 0..<Int.random(in: 1...4, using: &random) where !bytes.isEmpty {
                    let position = Int.random(in: 0..<bytes.count, using: &random)
                    bytes[position] = alphabet.randomElement(using: &random) ?? 0
                }
            }
            let text = String(decoding: bytes, as: UTF8.self)
            let parsed = CacheControl(fieldValues: [text, "only-if-cached"])
            #expect(parsed.onlyIfCached, "\(Array(text.utf8))")
        }
    }
}

/// SplitMix64: a seeded generator, so the randomised tests are the same on every run.
struct CacheSyntaxRandom: RandomNumberGenerator {
    var state: UInt64

    init(seed: UInt64) {
        state = seed
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var mixed = state
        mixed = (mixed ^ (mixed >> 30)) &* 0xBF58_476D_1CE4_E5B9
        mixed = (mixed ^ (mixed >> 27)) &* 0x94D0_49BB_1331_11EB
        return mixed ^ (mixed >> 31)
    }
}
