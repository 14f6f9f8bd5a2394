//! Corvid task families, packs, oracles, checkers and the curriculum (see the tasks issue).
