import Synchronization

/// Per-loop objects that the layers above the core keep on a loop (the delayed-perform registry,
/// and what later modules attach), so that the core needs to know nothing about them: one object
/// per type, made on first use and kept for the loop's life.
final class LoopAttachments: Sendable {
    private let objects = Mutex<[ObjectIdentifier: any AnyObject & Sendable]>([:])

    /// The loop's object of type `T`, made with `make` the first time it is asked for.
    ///
    /// - Complexity: One lock and one dictionary lookup.
    func object<T: AnyObject & Sendable>(_ type: T.Type, make: () -> T) -> T {
        objects.locked { objects in
            if let existing = objects[ObjectIdentifier(type)] {
                // Stored under T's identifier only, below.
                return unsafeDowncast(existing, to: T.self)
            }
            let made = make()
            objects[ObjectIdentifier(type)] = made
            return made
        }
    }

    /// The loop's object of type `T`, if one was made.
    func existing<T: AnyObject & Sendable>(_ type: T.Type) -> T? {
        objects.locked { objects in objects[ObjectIdentifier(type)].map { unsafeDowncast($0, to: T.self) } }
    }
}
