import Foundation

/// A stall's flame graph as one self-contained HTML page: an icicle (outermost function on top,
/// callees below, each box as wide as its share of the samples), drawn as SVG in the page itself
/// (no script, no network access). The blamed function (``StallReport/stuckIn``) is outlined in
/// red; a box's name, samples and share show on hover.
///
/// ```swift
/// import Foundation
/// import RunLoopMonitor
///
/// func save(_ report: StallReport) throws {
///     let page = FlameGraphPage.html(for: report)
///     try page.write(toFile: "/tmp/stall.html", atomically: true, encoding: .utf8)
/// }
/// ```
///
/// The page's `svg` carries `data-samples` (samples in all) and `data-boxes`, and each box's `g`
/// element `data-name`, `data-samples` and, for the blamed one, `data-blamed` (what
/// `.ci/timeline-check` reads in headless Chromium). ``StallReport/foldedStacks`` is the same data
/// for `flamegraph.pl` or speedscope.
public enum FlameGraphPage {
    /// The page for `report`: its folded stacks, titled with where and how long it stalled.
    public static func html(for report: StallReport) -> String {
        let title = "Stall of \(report.loop) in \(report.item): \(Int(report.duration.components.seconds * 1000 + report.duration.components.attoseconds / 1_000_000_000_000_000)) ms, \(report.phase)"
        return html(folded: report.foldedStacks, title: title, blamed: report.stuckIn)
    }

    /// The page for folded stacks (`outer;…;inner count` per line; malformed lines are skipped).
    ///
    /// - Parameters:
    ///   - folded: the stacks, as ``CallTree/folded`` writes them.
    ///   - title: the page's heading.
    ///   - blamed: the function to outline, if any.
    public static func html(folded: String, title: String, blamed: String? = nil) -> String {
        let root = Node(name: "all")
        for line in folded.split(separator: "\n") {
            guard let space = line.lastIndex(of: " "), let count = Int(line[line.index(after: space)...]), count > 0 else { continue }
            root.add(line[..<space].split(separator: ";").map(String.init)[...], count: count)
        }
        var boxes: [String] = []
        let width = 1200.0
        let rowHeight = 18.0
        var depth = 0
        func draw(_ node: Node, x: Double, level: Int) {
            let boxWidth = root.count > 0 ? width * Double(node.count) / Double(root.count) : 0
            guard boxWidth >= 0.5 else { return }
            depth = max(depth, level + 1)
            let y = Double(level) * rowHeight
            let isBlamed = blamed != nil && node.name == blamed
            let share = root.count > 0 ? Double(node.count) * 100 / Double(root.count) : 0
            let label = boxWidth > 40 ? escape(String(node.name.prefix(Int(boxWidth / 7)))) : ""
            boxes.append(
                """
                <g data-name="\(escape(node.name))" data-samples="\(node.count)"\(isBlamed ? " data-blamed=\"true\"" : "")>\
                <title>\(escape(node.name)): \(node.count) samples, \(String(format: "%.1f", share)) %</title>\
                <rect x="\(format(x))" y="\(format(y))" width="\(format(max(boxWidth - 1, 0.5)))" height="\(format(rowHeight - 1))" \
                fill="\(colour(node.name, level: level))"\(isBlamed ? " stroke=\"#d00\" stroke-width=\"2\"" : "")/>\
                <text x="\(format(x + 3))" y="\(format(y + 13))">\(label)</text></g>
                """)
            var childX = x
            for child in node.children {
                draw(child, x: childX, level: level + 1)
                childX += width * Double(child.count) / Double(max(root.count, 1))
            }
        }
        draw(root, x: 0, level: 0)
        let height = Double(max(depth, 1)) * rowHeight
        return """
            <!DOCTYPE html>
            <html lang="en"><head><meta charset="utf-8"><title>\(escape(title))</title>
            <style>
            body { font: 13px -apple-system, "Segoe UI", sans-serif; margin: 16px; color: #222; }
            svg text { font: 11px monospace; pointer-events: none; }
            svg g:hover rect { stroke: #000; stroke-width: 1; }
            p.note { color: #555; }
            </style></head>
            <body>
            <h1>\(escape(title))</h1>
            <p class="note">\(root.count) samples. Outermost function on top, callees below; a box's width is its share of the \
            samples.\(blamed.map { " Outlined in red: where the stall is blamed, <code>\(escape($0))</code>." } ?? "")</p>
            <svg xmlns="http://www.w3.org/2000/svg" width="\(Int(width))" height="\(Int(height))" \
            data-samples="\(root.count)" data-boxes="\(boxes.count)">
            \(boxes.joined(separator: "\n"))
            </svg>
            </body></html>

            """
    }

    private final class Node {
        let name: String
        var count = 0
        var children: [Node] = []

        init(name: String) { self.name = name }

        func add(_ path: ArraySlice<String>, count: Int) {
            self.count += count
            guard let first = path.first else { return }
            let child = children.first { $0.name == first } ?? {
                let made = Node(name: first)
                children.append(made)
                return made
            }()
            child.add(path.dropFirst(), count: count)
        }
    }

    private static func format(_ value: Double) -> String { String(format: "%.1f", value) }

    /// Warm colours, stable per name (as flamegraph.pl's), the root grey.
    private static func colour(_ name: String, level: Int) -> String {
        guard level > 0 else { return "#ddd" }
        var hash: UInt32 = 2_166_136_261
        for byte in name.utf8 { hash = (hash ^ UInt32(byte)) &* 16_777_619 }
        let red = 205 + Int(hash % 50)
        let green = 80 + Int((hash >> 8) % 130)
        let blue = Int((hash >> 16) % 55)
        return "rgb(\(red),\(green),\(blue))"
    }

    private static func escape(_ text: String) -> String {
        var out = ""
        for character in text {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.append(character)
            }
        }
        return out
    }
}
