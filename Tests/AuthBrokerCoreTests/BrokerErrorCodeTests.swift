import AuthBrokerCore
import Foundation
import Testing

@Suite("Broker error codes")
struct BrokerErrorCodeTests {
    static var openAPIURL: URL {
        URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent()  // AuthBrokerCoreTests
            .deletingLastPathComponent()  // Tests
            .deletingLastPathComponent()  // package root
            .appendingPathComponent("docs/api/openapi.yaml")
    }

    @Test("docs/api/openapi.yaml lists exactly the codes of BrokerErrorCode, each once")
    func openAPIListsTheSameSet() throws {
        let document = try String(contentsOf: Self.openAPIURL, encoding: .utf8)
        let documented = try #require(
            OpenAPISchemaEnum.values(ofSchema: "BrokerErrorCode", in: document),
            "docs/api/openapi.yaml has no schema BrokerErrorCode with an enum under components.schemas"
        )
        let declared = Set(BrokerErrorCode.allCases.map(\.rawValue))
        let notDocumented = declared.subtracting(documented).sorted()
        let notDeclared = Set(documented).subtracting(declared).sorted()
        #expect(notDocumented.isEmpty, "in BrokerErrorCode but missing from docs/api/openapi.yaml: \(notDocumented)")
        #expect(notDeclared.isEmpty, "in docs/api/openapi.yaml but missing from BrokerErrorCode: \(notDeclared)")
        let listedTwice = Dictionary(grouping: documented, by: { $0 }).filter { $0.value.count > 1 }.keys.sorted()
        #expect(listedTwice.isEmpty, "listed more than once in docs/api/openapi.yaml: \(listedTwice)")
    }

    @Test("every code is snake_case, as the problem type's pattern `^urn:authbroker:problem:[a-z0-9_]+$` requires")
    func codesAreSnakeCase() {
        let allowed = Set("abcdefghijklmnopqrstuvwxyz0123456789_")
        for code in BrokerErrorCode.allCases {
            #expect(!code.rawValue.isEmpty && code.rawValue.allSatisfy(allowed.contains), "\(code.rawValue)")
        }
    }

    @Test("a code encodes, decodes and interpolates as its wire form")
    func wireForm() throws {
        let encoded = try BrokerJSON.encoder().encode([BrokerErrorCode.secretStoreIO])
        #expect(String(decoding: encoded, as: UTF8.self) == #"["secret_store_io"]"#)
        #expect(try BrokerJSON.decoder().decode([BrokerErrorCode].self, from: encoded) == [.secretStoreIO])
        #expect("\(BrokerErrorCode.invalidJSON)" == "invalid_json")
    }

    @Test("the reader takes the named schema's enum only, skipping comments")
    func readerFindsTheNamedSchema() {
        let document = """
            openapi: 3.1.0
            paths:
              /v1/x:
                get:
                  parameters:
                    - name: Wanted
            components:
              schemas:
                Other:
                  type: string
                  enum: [alpha, beta]
                Wanted:
                  type: string
                  description: |
                    enum:
                      - not_a_value
                  enum:
                    # a group
                    - one
                    - "two"   # a comment
                    - three
                  example: one
                Later:
                  enum:
                    - four
            """
        #expect(OpenAPISchemaEnum.values(ofSchema: "Wanted", in: document) == ["one", "two", "three"])
        #expect(OpenAPISchemaEnum.values(ofSchema: "Other", in: document) == ["alpha", "beta"])
        #expect(OpenAPISchemaEnum.values(ofSchema: "Missing", in: document) == nil)
    }
}

/// The `enum` values of one schema under `components.schemas` of an OpenAPI document, read by
/// indentation (the package has no YAML parser). It knows the forms docs/api/openapi.yaml uses:
/// a block list (`- value` lines, comments and quotes allowed) or a flow list (`enum: [a, b]`),
/// directly under the schema. Nil when the schema or its enum is not there.
enum OpenAPISchemaEnum {
    static func values(ofSchema name: String, in document: String) -> [String]? {
        let lines = document.split(separator: "\n", omittingEmptySubsequences: false).compactMap(Line.init)
        guard let components = lines.indices.first(where: { lines[$0].indent == 0 && lines[$0].text == "components:" }),
            let schemas = children(of: components, in: lines).first(where: { lines[$0].text == "schemas:" }),
            let schema = children(of: schemas, in: lines).first(where: { lines[$0].text == "\(name):" }),
            let enumKey = children(of: schema, in: lines).first(where: { lines[$0].text.hasPrefix("enum:") })
        else { return nil }
        let inline = lines[enumKey].text.dropFirst("enum:".count).trimmingCharacters(in: .whitespaces)
        if inline.hasPrefix("[") && inline.hasSuffix("]") {
            return inline.dropFirst().dropLast().split(separator: ",").map { unquoted($0.trimmingCharacters(in: .whitespaces)) }
        }
        guard inline.isEmpty else { return nil }
        var values: [String] = []
        for line in lines[(enumKey + 1)...] {
            // A block sequence may also sit at its key's own indentation (YAML's indentless form).
            let isItem = line.text.hasPrefix("- ")
            guard line.indent > lines[enumKey].indent || (line.indent == lines[enumKey].indent && isItem) else { break }
            guard isItem else { return nil }
            values.append(unquoted(line.text.dropFirst(2).trimmingCharacters(in: .whitespaces)))
        }
        return values
    }

    /// A line with content: its indentation, and its text without a trailing comment. Blank and
    /// comment-only lines make none.
    private struct Line {
        var indent: Int
        var text: String

        init?(_ raw: Substring) {
            let content = raw.drop { $0 == " " }
            guard !content.isEmpty, !content.hasPrefix("#") else { return nil }
            self.indent = raw.count - content.count
            let uncommented = content.range(of: " #").map { content[..<$0.lowerBound] } ?? content
            self.text = uncommented.trimmingCharacters(in: .whitespaces)
        }
    }

    /// The indices of the lines directly under the one at `parent` (the first line nested under
    /// it sets their indentation).
    private static func children(of parent: Int, in lines: [Line]) -> [Int] {
        let nested = lines.indices.dropFirst(parent + 1).prefix { lines[$0].indent > lines[parent].indent }
        guard let first = nested.first else { return [] }
        return nested.filter { lines[$0].indent == lines[first].indent }
    }

    private static func unquoted(_ text: String) -> String {
        guard text.count >= 2, let quote = text.first, quote == "\"" || quote == "'", text.last == quote else { return text }
        return String(text.dropFirst().dropLast())
    }
}
