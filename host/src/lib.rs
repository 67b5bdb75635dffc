//! The bloomery host library.
