#include <gtest/gtest.h>

#include <string>

#include "jobguard/text.hpp"

using jobguard::escape_text;
using jobguard::redact_url;

TEST(EscapeText, ControlBytesBecomeVisibleEscapes) {
  EXPECT_EQ(escape_text("a\nb"), "a\\nb");
  EXPECT_EQ(escape_text("a\r\tb"), "a\\r\\tb");
  EXPECT_EQ(escape_text(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(escape_text("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(escape_text("del\x7f"), "del\\x7f");
  EXPECT_EQ(escape_text("back\\slash"), "back\\\\slash");
}

TEST(EscapeText, PrintableUtf8IsKeptInvalidBytesAndC1AreEscaped) {
  EXPECT_EQ(escape_text("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac");
  EXPECT_EQ(escape_text("\xc2\x9b" "2J"), "\\xc2\\x9b2J");  // U+009B, the 8-bit CSI
  EXPECT_EQ(escape_text("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(escape_text("\xc3"), "\\xc3");            // truncated sequence
  EXPECT_EQ(escape_text("\xc0\xaf"), "\\xc0\\xaf");    // overlong '/'
  EXPECT_EQ(escape_text("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // surrogate
}

TEST(EscapeText, LongTextIsCut) {
  EXPECT_EQ(escape_text(std::string(300, 'k'), 10), "kkkkkkkkkk...");
  EXPECT_EQ(escape_text(std::string(300, 'k'), 0).size(), 300u);
  EXPECT_EQ(escape_text("short", 10), "short");
}

TEST(RedactUrl, HidesThePasswordOfEveryUrlForm) {
  EXPECT_EQ(redact_url("redis://alice:s3cret@h:6379/0"), "redis://alice:***@h:6379/0");
  EXPECT_EQ(redact_url("redis://:s3cret@h"), "redis://:***@h");
  EXPECT_EQ(redact_url("redis://s3cret@h"), "redis://***@h");
  EXPECT_EQ(redact_url("redis://h:6379/0"), "redis://h:6379/0");
  EXPECT_EQ(redact_url("postgresql://app:pw@db.internal:5432/jobs"), "postgresql://app:***@db.internal:5432/jobs");
}

TEST(RedactUrl, PasswordsWithSlashQuestionMarkOrAtAreHiddenWhole) {
  EXPECT_EQ(redact_url("redis://:se/cr?et@127.0.0.1:1/0"), "redis://:***@127.0.0.1:1/0");
  EXPECT_EQ(redact_url("redis://u:p@ss/w?rd@h/0?timeout=1s"), "redis://u:***@h/0?timeout=1s");
  EXPECT_EQ(redact_url("postgres://u:a/b@h/db"), "postgres://u:***@h/db");
}

TEST(RedactUrl, AForgottenAtStillHidesWhatWouldBeReadAsAPort) {
  // "redis://user:hunter2/0" reads as host "user", port "hunter2".
  EXPECT_EQ(redact_url("redis://user:hunter2/0"), "redis://user:***/0");
  EXPECT_EQ(redact_url("redis://h:6380/0"), "redis://h:6380/0");
  EXPECT_EQ(redact_url("redis://[::1]:6380"), "redis://[::1]:6380");
}

TEST(RedactUrl, PasswordParametersAreHidden) {
  EXPECT_EQ(redact_url("postgresql://h/db?user=u&password=s3cret&sslmode=require"),
            "postgresql://h/db?user=u&password=***&sslmode=require");
  EXPECT_EQ(redact_url("host=db user=app password=s3cret dbname=x"), "host=db user=app password=*** dbname=x");
  EXPECT_EQ(redact_url("host=db password='a b\\' c' dbname=x"), "host=db password=*** dbname=x");
  EXPECT_EQ(redact_url("host=db password = s3cret"), "host=db password = ***");
  EXPECT_EQ(redact_url("PASSWORD=x"), "PASSWORD=***");
  // Not a password parameter: "mypassword=" is another key.
  EXPECT_EQ(redact_url("mypassword=x"), "mypassword=x");
}

TEST(RedactUrl, TheResultIsEscaped) {
  EXPECT_EQ(redact_url("redis://h\n:1"), "redis://h\\n:1");
  EXPECT_EQ(redact_url("redis://a:b\x1b@h"), "redis://a:***@h");
}

TEST(EscapeControls, EscapesControlBytesButNotBackslashes) {
  EXPECT_EQ(jobguard::escape_controls("a\\x1b b\nc\x1b"), "a\\x1b b\\nc\\x1b");
  EXPECT_EQ(jobguard::escape_controls(std::string(300, 'k')).size(), 300u);
}
