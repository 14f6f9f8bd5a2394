//! The Corvid actor (see the actor issue).
