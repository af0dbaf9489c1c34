-- The check every script grant on one server makes against the lock-state
-- record (docs/lock-safety.md, "Quarantine after lost lock state"): true when
-- the record's epoch is not the one the client's gate checked, because another
-- client found a restart, a flush, an eviction or a clock step since and
-- started a quarantine. A grant made then could join a holder whose key that
-- loss took; the caller refuses it and its client checks again. `epoch` nil
-- or '' (a cluster, where the record is in another slot): not compared.
local function epoch_moved(record, epoch)
  return epoch ~= nil and epoch ~= '' and redis.call('HGET', record, 'id') ~= epoch
end
