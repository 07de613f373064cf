"""``tfd conformance``: a live deployment checked against the contract (``gates``), reported a row a
check (``report``), and two reports compared key by key. Top layer (docs/architecture.md)."""
