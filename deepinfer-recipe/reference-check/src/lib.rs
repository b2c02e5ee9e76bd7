//! Empty: this package only holds tests and benches.
