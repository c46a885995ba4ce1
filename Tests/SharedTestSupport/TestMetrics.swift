import Metrics
import MetricsTestKit

/// The process's swift-metrics factory for the tests. swift-metrics may be bootstrapped once per
/// process, and `swift test` runs every test target in one process: each target that checks
/// metrics uses this one (a global, initialized once whichever suite reads it first) and tells its
/// metrics apart by their dimensions.
public let testMetrics: TestMetrics = {
    let metrics = TestMetrics()
    MetricsSystem.bootstrap(metrics)
    return metrics
}()
