//! Corvid process rewards, returns and advantage estimators (see the tasks issue).
