"""What a client in any language is checked against: the conformance kit (`rsc conformance`),
its client contract, the history checker it judges by, and shared test vectors."""
