-- Names belong to an identity, the issuing CA and the certificate's name, not to one
-- certificate: a renewed or re-keyed certificate of the same name takes its names over.
-- Hex of the issuing CA's key; '' for rows written before this column (taken as the same CA).
ALTER TABLE clients ADD COLUMN issuer TEXT NOT NULL DEFAULT '';
