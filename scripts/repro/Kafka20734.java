import java.io.*;
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.*;

// Driver of kafka-20734.sh: a transactional producer writes one record to
// topic t (on node 2) and commits it while node 2 may be paused; then a
// read_committed consumer counts what it sees. Steps wait for a line on
// stdin so the script can start, pause and resume node 2 in between.
public class Kafka20734 {
  public static void main(String[] a) throws Exception {
    String bs = a[0];
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    Properties pp = new Properties();
    pp.put("bootstrap.servers", bs);
    pp.put("transactional.id", "repro");
    pp.put("key.serializer", StringSerializer.class.getName());
    pp.put("value.serializer", StringSerializer.class.getName());
    pp.put("transaction.timeout.ms", "60000");
    pp.put("max.block.ms", "120000");
    KafkaProducer<String,String> p = new KafkaProducer<>(pp);
    p.initTransactions();   // creates __transaction_state on broker 1 (broker 2 not up yet)
    System.out.println("INITED"); System.out.flush();
    in.readLine();          // broker 2 is up
    Properties ap = new Properties(); ap.put("bootstrap.servers", bs);
    Admin admin = Admin.create(ap);
    admin.createTopics(List.of(new NewTopic("t", Map.of(0, List.of(2))))).all().get();
    Thread.sleep(2000);
    p.beginTransaction();
    p.send(new ProducerRecord<>("t", "k", "v")).get();
    System.out.println("SENT (acked by broker 2)"); System.out.flush();
    in.readLine();          // broker 2 paused (and fenced, or not)
    long t0 = System.currentTimeMillis();
    p.commitTransaction();
    System.out.println("COMMITTED in " + (System.currentTimeMillis() - t0) + " ms"); System.out.flush();
    in.readLine();          // broker 2 resumed and unfenced
    System.out.println("describeTransactions: " + admin.describeTransactions(List.of("repro")).all().get());
    TopicPartition tp = new TopicPartition("t", 0);
    System.out.println("describeProducers: " + admin.describeProducers(List.of(tp)).all().get());
    Properties cp = new Properties();
    cp.put("bootstrap.servers", bs);
    cp.put("group.id", "g" + System.nanoTime());
    cp.put("isolation.level", "read_committed");
    cp.put("auto.offset.reset", "earliest");
    cp.put("key.deserializer", StringDeserializer.class.getName());
    cp.put("value.deserializer", StringDeserializer.class.getName());
    KafkaConsumer<String,String> c = new KafkaConsumer<>(cp);
    c.assign(List.of(tp)); c.seekToBeginning(List.of(tp));
    int n = 0; long end = System.currentTimeMillis() + 15000;
    while (System.currentTimeMillis() < end && n == 0) n += c.poll(Duration.ofMillis(500)).count();
    System.out.println("read_committed records: " + n + " (end offsets " + c.endOffsets(List.of(tp)) + ")");
    System.out.flush();
    c.close(); p.close(); admin.close();
  }
}
