#if GTK
import Foundation

/// xdotool and ImageMagick on the display GTK runs on (`DISPLAY`, which `GTK.start` sets).
public enum XTools {
    /// Starts an xdotool drag in window `window`: the pointer to `from`, a press of button 1,
    /// `steps` moves of `dy` pixels every `interval`, the release. Returns the running xdotool (the
    /// loop keeps running meanwhile; the drag is GTK's input).
    public static func startDrag(
        window: UInt, from: (x: Int, y: Int), steps: Int = 20, dy: Int = 6, interval: Duration = .milliseconds(50)
    ) throws(ToolError) -> ToolProcess {
        let pause = String(format: "%.3f", Double(interval.components.attoseconds) / 1e18 + Double(interval.components.seconds))
        var arguments = ["xdotool", "mousemove", "--window", "\(window)", "\(from.x)", "\(from.y)", "sleep", "0.2", "mousedown", "1"]
        for _ in 0..<steps { arguments += ["sleep", pause, "mousemove_relative", "--", "0", "\(dy)"] }
        arguments += ["sleep", pause, "mouseup", "1"]
        return try ToolProcess(arguments)
    }

    /// Starts xdotool moving the pointer over window `window` through `points`, `interval` apart.
    public static func startMotion(window: UInt, points: [(x: Int, y: Int)], interval: Duration = .milliseconds(30))
        throws(ToolError) -> ToolProcess
    {
        let pause = String(format: "%.3f", Double(interval.components.attoseconds) / 1e18 + Double(interval.components.seconds))
        var arguments = ["xdotool"]
        for point in points {
            arguments += ["mousemove", "--window", "\(window)", "\(point.x)", "\(point.y)", "sleep", pause]
        }
        return try ToolProcess(arguments)
    }

    /// Starts ImageMagick's `import` writing window `window` to the PNG `path` (without the
    /// date chunks, so that the same pixels give the same file).
    public static func startScreenshot(window: UInt, path: String) throws(ToolError) -> ToolProcess {
        try ToolProcess(["import", "-window", "\(window)", "-define", "png:exclude-chunks=date,time", path])
    }

    /// How many pixels differ between two images (ImageMagick's `compare -metric AE`).
    public static func differingPixels(_ first: String, _ second: String) throws(ToolError) -> Int {
        let compare = try ToolProcess(["compare", "-metric", "AE", first, second, "null:"])
        let code = compare.wait(timeout: .seconds(30))
        let output = compare.output().trimmingCharacters(in: .whitespacesAndNewlines)
        // Exit 0: same, 1: different, 2: an error. The count is the first word printed.
        guard code <= 1, let count = Double(output.split(separator: " ").first ?? "") else {
            throw .failed(command: compare.command, code: code, output: output)
        }
        return Int(count)
    }
}
#endif
