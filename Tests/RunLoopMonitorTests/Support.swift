import CRunLoopMonitor

func currentThreadID() -> Int32 { crlm_gettid() }
