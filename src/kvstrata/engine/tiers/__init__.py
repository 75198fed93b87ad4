"""Storage tiers behind one small interface, ordered fastest first."""
