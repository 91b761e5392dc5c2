// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

// Typed ids (issue 31): a job, a dispute, a collaborative job and an outer-jury case are
// all uint256, and one passed as another is a bug the compiler cannot see. As user-defined
// value types they cost no code and encode as uint256 (only the ABI's `internalType`
// names them), so clients need no change. node/chain/ids.py names the same four.
type JobId is uint256;
type DisputeId is uint256;
type CollabId is uint256;
type CaseId is uint256;
